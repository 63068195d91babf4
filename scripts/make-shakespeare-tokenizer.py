# Makes plans/tokenizers/shakespeare.json, the tokenizer of plans/shakespeare.lua: a byte-level
# BPE (GPT-2's form: the ByteLevel pre-tokenizer and decoder, <|endoftext|> its eos) of 2048 ids
# trained by the Hugging Face `tokenizers` library on data/shakespeare/shakespeare.txt
# (scripts/fetch-shakespeare.sh). tycho reads it in C (host/text/), giving the library's ids.
# Run from the repository root, in a venv with tokenizers installed:
#   /usr/bin/python3 -m venv /tmp/tv && /tmp/tv/bin/pip install tokenizers
#   /tmp/tv/bin/python scripts/make-shakespeare-tokenizer.py
import os, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

corpus = "data/shakespeare/shakespeare.txt"
if not os.path.exists(corpus):
    sys.exit("no %s: run scripts/fetch-shakespeare.sh first (from the repository root)" % corpus)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=2048, special_tokens=["<|endoftext|>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train([corpus], tr)
os.makedirs("plans/tokenizers", exist_ok=True)
tok.save("plans/tokenizers/shakespeare.json")
print("plans/tokenizers/shakespeare.json: %d ids" % tok.get_vocab_size())
