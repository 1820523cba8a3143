"""The embedded teaching model: its corpus, tokenizer, training and evaluation. The serving core never imports this."""
