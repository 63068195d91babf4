# The real-vocabulary check of tests/e2e/tokenize.sh: two tokenizers that released models use,
# taken from PyPI's mistral-common wheel (Apache 2.0; the first argument, a .whl), written as the
# tokenizer.json files of the Hugging Face hub are, and the `tokenizers` library's ids of every
# line of OUT/live.jsonl (written by live.py) under each. Into OUT (the second argument):
#   mistral_sp.json   the SentencePiece model of Mistral 7B v0.1 (32,000 pieces, byte fallback),
#                     as a BPE whose merges are ranked by the merged piece's score, with the
#                     Prepend("▁") + Replace(" ", "▁") normalizer of Llama 2 / Mistral's files;
#   mistral_tekken.json  the byte-level BPE of Mistral NeMo (tekken: 130,072 ranked byte strings
#                     after 1,000 special ids, so ids pass 65,535) with its own split pattern
#                     (upper/lower-case letter classes and marks), merges ranked by the merged
#                     string's rank as for every ranked (tiktoken-style) vocabulary;
# NAME.ids for each (encode(line, add_special_tokens=False), concatenated) and real.names.
# Needs `tokenizers` and `sentencepiece` (the latter only to read the .model file).
import base64, json, os, sys, zipfile
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

wheel, out = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)


def ranked_merges(tokens):
    """tokens: {string: rank}. Each string of two or more symbols is made by joining any split
    of it into two strings of the vocabulary; the merge is ranked by the joined string's rank,
    ties by the parts' ranks (lower first)."""
    merges = []
    for s, rank in tokens.items():
        for i in range(1, len(s)):
            a, b = s[:i], s[i:]
            if a in tokens and b in tokens:
                merges.append((rank, tokens[a], tokens[b], a, b))
    merges.sort()
    return [(a, b) for _, _, _, a, b in merges]


def sentencepiece_bpe():
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_proto=z.read("mistral_common/data/tokenizer.model.v1"))
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    # a piece's score orders its merge: higher scores merge first, equal scores by id
    order = {p: (-sp.get_score(i), i) for p, i in vocab.items()
             if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))}
    merges = ranked_merges(order)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=sp.id_to_piece(sp.unk_id()), fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True, normalized=False)
                            for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())])
    return tok


def byte_symbols():
    """The byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest for
    code points from 256 up, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tekken_bpe():
    d = json.loads(z.read("mistral_common/data/tekken_240718.json"))
    cfg = d["config"]
    specials = cfg["default_num_special_tokens"]
    n = cfg["default_vocab_size"] - specials
    sym = byte_symbols()
    ranked = {}
    for v in d["vocab"][:n]:
        ranked["".join(sym[b] for b in base64.b64decode(v["token_bytes"]))] = v["rank"]
    merges = ranked_merges(ranked)
    vocab = {s: r + specials for s, r in ranked.items()}
    names = ["<unk>", "<s>", "</s>"] + ["<SPECIAL_%d>" % i for i in range(3, specials)]
    for i, name in enumerate(names):
        vocab[name] = i
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(cfg["pattern"]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in names])
    return tok


with open(os.path.join(out, "live.jsonl"), encoding="utf-8") as f:
    lines = [json.loads(l)["text"] for l in f]
names = []
for name, make in (("mistral_sp", sentencepiece_bpe), ("mistral_tekken", tekken_bpe)):
    path = os.path.join(out, name + ".json")
    make().save(path)
    tok = Tokenizer.from_file(path)
    ids = []
    for l in lines:
        ids += tok.encode(l, add_special_tokens=False).ids
    with open(os.path.join(out, name + ".ids"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    names.append(name)
with open(os.path.join(out, "real.names"), "w") as f:
    f.write("\n".join(names) + "\n")
