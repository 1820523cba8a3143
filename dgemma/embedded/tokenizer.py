"""A character-level tokenizer for the embedded model, built with Hugging Face `tokenizers`.

One token per character keeps the vocabulary tiny (the sampler's [CL, vocab] step stays cheap on a
CPU) and makes every canvas position one visible character in the demo. Special ids follow Gemma:
pad 0, eos 1, bos 2. Encoding prepends <bos>, so `tokenizer(prompt)` is exactly what the model saw
in training.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from dgemma.embedded.corpus import ALPHABET

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIALS = (PAD, EOS, BOS, UNK)  # ids 0..3, in this order
PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(4)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for char in ALPHABET:
        vocab[char] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # The corpus is lower case; a demo user typing "Count 3 to 9" should still be understood.
    core.normalizer = normalizers.Lowercase()
    # Every character (spaces included) is its own token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
                                   padding_side="left")
