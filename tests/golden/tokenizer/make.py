# Makes the tokenizer golden files of tests/unit/test_tokenizer.c and tests/e2e/tokenize.sh with
# the Hugging Face `tokenizers` library: two small BPE tokenizers trained on docs/*.md (vocab
# 1000) — bytelevel.json (GPT-2 style: ByteLevel pre-tokenizer and decoder) and sp.json
# (Llama 2 style: Prepend/Replace normalizer, byte fallback, fuse_unk, no pre-tokenizer) — and,
# for each, the ids of text.txt and special.txt as tokenizers encodes them
# (encode(text, add_special_tokens=False), the text read with errors="replace"), one id a line.
# Run from the repository root, in a venv with tokenizers installed:
#   python3 -m venv /tmp/tv && /tmp/tv/bin/pip install tokenizers
#   /tmp/tv/bin/python tests/golden/tokenizer/make.py
import glob, json, os, sys
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers

here = os.path.dirname(os.path.abspath(__file__))
corpus = sorted(glob.glob("docs/*.md"))
if not corpus:
    sys.exit("run from the repository root (docs/*.md)")


def bytelevel(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(corpus, tr)
    tok.save(path)


def sentencepiece(path):
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tr = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    tok.train(corpus, tr)
    tok.save(path)
    # Llama 2's form: the byte tokens in the vocab only, the normalizer doing the ▁ work, no
    # pre-tokenizer, the decoder undoing it
    j = json.load(open(path, encoding="utf-8"))
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in byte_tokens]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    j["post_processor"] = {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [j["model"]["vocab"]["<s>"]], "tokens": ["<s>"]}}}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


bytelevel(os.path.join(here, "bytelevel.json"))
sentencepiece(os.path.join(here, "sp.json"))
for name in ("bytelevel", "sp"):
    tok = Tokenizer.from_file(os.path.join(here, name + ".json"))
    for text in ("text", "special"):
        s = open(os.path.join(here, text + ".txt"), encoding="utf-8", errors="replace").read()
        ids = tok.encode(s, add_special_tokens=False).ids
        with open(os.path.join(here, "%s.%s.ids" % (name, text)), "w") as f:
            f.write("".join("%d\n" % i for i in ids))
