"""How much of a 128-token decode-step GEMM's time is its weights' HBM read? (perf-notes item 295)

Times F.linear(x[128, K], W[N, K]) (cuBLASLt, as the engine's GEMMs) with W cold (L2 flushed by a
256 MB write), warm (the same GEMM just before), and with a share of W's rows read into the L2 after
the flush (W[:f*N].sum(): the share a prefetch during the kernels before the GEMM could bring).
Events around each GEMM alone; the median of 50."""
import statistics
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
shapes = {"o": (4096, 4096), "qkv_mqa": (4352, 4096), "qkv_gqa8": (6144, 4096),
          "gate_up": (28672, 4096), "down": (4096, 14336)}
print(torch.cuda.get_device_name(), "torch", torch.__version__)
for name, (n, k) in shapes.items():
    x = torch.randn(128, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    y = F.linear(x, w)
    mb = n * k * 2 / 2**20
    res = {}
    for mode in ("cold", "warm", "pre25", "pre50", "pre100"):
        ts = []
        for _ in range(50):
            flush.fill_(1)
            if mode == "warm":
                F.linear(x, w, out=None)
            elif mode.startswith("pre"):
                f = int(mode[3:]) / 100
                w[: int(n * f)].sum()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); y = F.linear(x, w); e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1000)
        res[mode] = statistics.median(ts)
    cold = res["cold"]
    print(f"{name:9s} {n:6d} x {k:6d} ({mb:6.1f} MB): " +
          "  ".join(f"{m} {t:6.1f} us" for m, t in res.items()) +
          f"   cold {mb / 1024 / (cold / 1e6):6.0f} GB/s")
