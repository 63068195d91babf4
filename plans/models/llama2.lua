-- Llama 2 model configurations (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned
-- Chat Models", Table 1 and the released config.json files): 7B with multi-head attention,
-- 70B with grouped-query attention (8 key/value heads). Use as `model = llama2["7b"]`.
local llama2 = {}

llama2["7b"] = {
  family = "llama",
  n_layers = 32,
  dim = 4096,
  n_heads = 32,
  n_kv_heads = 32,
  ffn_dim = 11008,
  vocab = 32000,
  max_seq = 4096,
  norm_eps = 1e-5,
  rope_theta = 10000,
}

llama2["13b"] = {
  family = "llama",
  n_layers = 40,
  dim = 5120,
  n_heads = 40,
  n_kv_heads = 40,
  ffn_dim = 13824,
  vocab = 32000,
  max_seq = 4096,
  norm_eps = 1e-5,
  rope_theta = 10000,
}

llama2["70b"] = {
  family = "llama",
  n_layers = 80,
  dim = 8192,
  n_heads = 64,
  n_kv_heads = 8,
  ffn_dim = 28672,
  vocab = 32000,
  max_seq = 4096,
  norm_eps = 1e-5,
  rope_theta = 10000,
}

return llama2
