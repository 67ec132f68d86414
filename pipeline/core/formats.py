"""On-disk format constants shared by the tokenizer, examples and pre-training code (docs/formats.md).

One place for what the files written by one stage and read by another agree on. No imports:
this module is a code dependency of several DVC stages, so it changes only when a format does.
"""

# Vocabulary: the special tokens and their fixed ids ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPECIAL_IDS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = (SPECIAL_IDS[t] for t in SPECIAL_TOKENS)

# Examples shards (data/examples): split ids (they seed the per-split RNGs), the manifest,
# its schema version, and the Parquet columns the pre-training loader reads.
SPLIT_IDS = {"train": 0, "valid": 1}
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label")
STATIC_COLUMNS = ("masked_lm_positions", "masked_lm_ids")  # static masking only
# examples.mode: mlm_nsp (the columns above) or causal (packed blocks, pipeline/data/packing.py). The manifest
# says which in "mode"; one written before the key existed is mlm_nsp.
EXAMPLE_MODES = ("mlm_nsp", "causal")
PACKED_COLUMNS = ("input_ids",)  # causal: one list of exactly max_seq_len ids per row
UNIGRAM_COUNTS = "unigram_counts.npy"  # causal: the training split's token counts (int64 per id)
