# The live check of tests/e2e/tokenize.sh: trains tokenizers of the shapes tycho reads with the
# Hugging Face `tokenizers` library on docs/*.md, and writes into OUT (the first argument):
# NAME.json for each, live.jsonl (every line of a mixed text as one document) and NAME.ids (the
# library's encode(line, add_special_tokens=False) ids of every line, concatenated), and
# live.names. The shell script then compares tycho tokenize's ids with NAME.ids.
# Run from the repository root: python live.py OUT (with tokenizers installed).
import glob, json, os, sys
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

out = sys.argv[1]
corpus = sorted(glob.glob("docs/*.md"))
llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_style():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train(corpus, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    tok.add_tokens(["tycho plan"])  # a normalized, non-special added token
    return tok


def gpt2_prefix():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train(corpus, trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def metaspace(scheme):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    tok.decoder = decoders.Metaspace(prepend_scheme=scheme)
    tok.train(corpus, trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"]))
    return tok


def split_behaviours():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), behavior="merged_with_previous"),
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[.,;:]"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[A-Z]"), behavior="isolated", invert=True)])
    tok.train(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"]))
    return tok


lines = []
for p in corpus + ["README.md", "tests/golden/tokenizer/text.txt"]:
    with open(p, encoding="utf-8", errors="replace") as f:
        lines += [l.rstrip("\n") for l in f]
lines += ["Καλημέρα κόσμε 😀 日本語 مرحبا   \t x", "<|end_of_text|> and <|begin_of_text|>x", "tycho plan tycho planner", "</s> and <s>x <unk> y", "a<|endoftext|>b <|endoftext|> c",
          "DON'T YOU'LL it's 1234567 x²³ ½ ٣٤٥", "  leading and trailing  ", "\u00a0nbsp\u2003em\u3000ideographic",
          "\u01c5ungla \u01c8 Ǌ e\u0301cole नमस्ते 한국어 ÀÉÎ õ ÑANDÚ ﬁne Ⅻ ⓐ"]
lines = [l for l in lines if l.strip()]
with open(os.path.join(out, "live.jsonl"), "w", encoding="utf-8") as f:
    for l in lines:
        f.write(json.dumps({"text": l}, ensure_ascii=False) + "\n")
names = []
for name, make in (("llama3", llama3_style), ("gpt2prefix", gpt2_prefix), ("metaspace_always", lambda: metaspace("always")),
                   ("metaspace_first", lambda: metaspace("first")), ("splits", split_behaviours)):
    tok = make()
    tok.save(os.path.join(out, name + ".json"))
    tok = Tokenizer.from_file(os.path.join(out, name + ".json"))
    ids = []
    for l in lines:
        ids += tok.encode(l, add_special_tokens=False).ids
    with open(os.path.join(out, name + ".ids"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    names.append(name)
with open(os.path.join(out, "live.names"), "w") as f:
    f.write("\n".join(names) + "\n")
