"""The Llama flavors of src/model/llama_config.cc, for the Python benchmarks (no torch import):
bench/train_vs_torch.py checks them against the config.toml of each Crucible run it makes."""
FLAVORS = {
    "debug": dict(vocab=2048, dim=128, layers=2, heads=4, kv=2, ffn=352, tie=False),
    "tiny": dict(vocab=8192, dim=256, layers=4, heads=8, kv=4, ffn=688, tie=True),
    "small": dict(vocab=8192, dim=512, layers=6, heads=8, kv=4, ffn=1376, tie=False),
    "base": dict(vocab=32000, dim=768, layers=12, heads=12, kv=4, ffn=2048, tie=False),
    "1b": dict(vocab=32000, dim=2048, layers=16, heads=32, kv=8, ffn=8192, tie=False),
}
