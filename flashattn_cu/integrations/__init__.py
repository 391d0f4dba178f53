"""Integrations of flashattn_cu with other libraries, each opt-in and importing its library lazily.

    import flashattn_cu.integrations.transformers as fa_transformers
    fa_transformers.register()   # attn_implementation="flashattn_cu" in Hugging Face transformers

Importing this package imports nothing beyond flashattn_cu.
"""
