-- Mixtral model configurations (Jiang et al. 2024, "Mixtral of Experts"). 8x7B: the values of
-- the Hugging Face config.json of mistralai/Mixtral-8x7B-v0.1 (num_hidden_layers 32,
-- hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
-- vocab_size 32000, max_position_embeddings 32768, rope_theta 1e6, rms_norm_eps 1e-5,
-- num_local_experts 8, num_experts_per_tok 2, router_aux_loss_coef 0.02, tie_word_embeddings
-- false). Every layer's MLP is sparse. 46.7B parameters, 12.9B active per token. Use as
-- `model = mixtral["8x7b"]`.
local mixtral = {}

mixtral["8x7b"] = {
  family = "llama",
  n_layers = 32,
  dim = 4096,
  n_heads = 32,
  n_kv_heads = 8,
  ffn_dim = 14336,
  vocab = 32000,
  max_seq = 32768,
  norm_eps = 1e-5,
  rope_theta = 1e6,
  moe = { experts = 8, top_k = 2, aux_loss = 0.02 },
}

return mixtral
