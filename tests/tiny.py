"""The shape of the tiny random models the tests build (HF config keyword arguments).

Small enough for CI on two cores, big enough to have GQA (4 query heads over 2 KV heads)
and more than one layer.
"""

TINY_LLAMA = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

TINY_BERT = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    type_vocab_size=2,
)
"""A 2-layer BERT (the vocabulary is all-MiniLM-L6-v2's, whose tokenizer it shares)."""
