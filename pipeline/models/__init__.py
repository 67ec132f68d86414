"""The networks: BERT (Devlin et al. 2019), a GPT-2-style decoder, ELECTRA's generator and discriminator."""
