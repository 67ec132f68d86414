"""The data stages: download, cleaning, the task engine, tokenizer training and loading, MLM / NSP and causal examples."""
