"""The page's slider: a value typed into its box beyond its ends is taken at the nearer end, which the run's
own line then states; gr.Slider raises an error onto every output of the event and into the server's log."""

import gradio as gr


class Slider(gr.Slider):
    def preprocess(self, payload: float) -> float:
        return super().preprocess(min(max(payload, self.minimum), self.maximum))
