"""The torch layer: custom ops (opcheck, fake shapes), DeepseekV4MoE, and on
a CUDA device: the ops against the host path, torch.compile, CUDA-graph
capture and replay, and the vLLM adapter against the native loader."""

import numpy as np
import pytest

import nvfp4moe
import spec_ref
from conftest import requires_cuda
from moe_factory import make_config, make_tensors

torch = pytest.importorskip("torch")
import nvfp4moe.torch as nt  # noqa: E402


def _module(rng, device, cfg=None, **kw):
    cfg = cfg or make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)
    return nt.DeepseekV4MoE.from_tensors(cfg, device=device, **t, **kw), t


# ---- on any device (CPU here) ---------------------------------------------------

def test_quantize_op_equals_numpy_path(rng):
    x = rng.standard_normal((5, 64)).astype(np.float32)
    for scope, g in (("per_row", None), ("per_tensor", None), ("static", 0.01)):
        for layout in ("linear", "swizzled"):
            c, s, gg = nt.quantize(torch.from_numpy(x), scope, g, layout)
            assert s.dtype == torch.float8_e4m3fn
            c2, s2, g2 = nvfp4moe.quantize(x, scope, g, layout)
            np.testing.assert_array_equal(c.numpy(), c2)
            np.testing.assert_array_equal(s.view(torch.uint8).numpy(), s2)
            np.testing.assert_array_equal(gg.numpy(), g2)


def test_opcheck_cpu(rng):
    m, _ = _module(rng, "cpu")
    x = torch.randn(5, 64)
    torch.library.opcheck(torch.ops.nvfp4moe.moe_forward.default, (m.handle, x, None, None, None))
    ids = torch.tensor([[0, 1], [2, -1], [3, 4], [5, 6], [7, 0]], dtype=torch.int32)
    torch.library.opcheck(torch.ops.nvfp4moe.moe_forward.default, (m.handle, x, ids, torch.rand(5, 2), None))
    torch.library.opcheck(torch.ops.nvfp4moe.quantize.default, (x, "per_row", None, "linear"))
    torch.library.opcheck(torch.ops.nvfp4moe.quantize.default, (x, "static", 0.5, "swizzled"))


def test_module_cpu_matches_numpy_and_compiles(rng):
    m, _ = _module(rng, "cpu")
    x = torch.randn(2, 3, 64)
    y = m(x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.bfloat16
    y_np = m.moe.forward(x.reshape(6, 64).numpy())
    np.testing.assert_array_equal(y.reshape(6, 64).float().numpy(), y_np)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), y)


def test_registry_releases_layers(rng):
    m, _ = _module(rng, "cpu")
    handle = m.handle
    assert nt.registered_moe(handle) is m.moe
    del m
    import gc

    gc.collect()
    with pytest.raises(nvfp4moe.Error, match=f"moe handle {handle} is not registered"):
        nt.registered_moe(handle)


# ---- on a CUDA device -------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_quantize_is_bit_exact_with_host(rng, dtype):
    for rows, cols in ((1, 16), (7, 64), (130, 2048), (300, 7168)):
        x = torch.from_numpy((rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-8, 8, (rows, 1))))
                             .astype(np.float32)).to(dtype)
        x[0, :16] = 0
        if rows > 2:
            x[2, 3] = float("nan")
        for scope, g in (("per_row", None), ("per_tensor", None), ("static", 0.0123)):
            for layout in ("linear", "swizzled"):
                xc = x.cuda()
                c, s, gg = nt.quantize(xc, scope, g, layout)
                host_x = x.float().numpy() if dtype == torch.float32 else x.view(torch.int16).numpy().view(np.uint16)
                c2, s2, g2 = nvfp4moe.quantize(host_x, scope, g, layout)
                np.testing.assert_array_equal(c.cpu().numpy(), c2, err_msg=f"{rows}x{cols} {scope} {layout}")
                np.testing.assert_array_equal(s.view(torch.uint8).cpu().numpy(), s2)
                np.testing.assert_array_equal(gg.cpu().numpy(), g2)
                d = nvfp4moe.dequantize(c, s, gg, layout)
                np.testing.assert_array_equal(d.cpu().numpy(), nvfp4moe.dequantize(c2, s2, g2, layout))
                lin = nvfp4moe.scales_to_linear(nvfp4moe.scales_to_swizzled(s), rows, cols // 16)
                assert torch.equal(lin.view(torch.uint8).cpu(),
                                   torch.from_numpy(nvfp4moe.scales_to_linear(
                                       nvfp4moe.scales_to_swizzled(s.view(torch.uint8).cpu().numpy()), rows,
                                       cols // 16)))


@requires_cuda
def test_gpu_moe_matches_cpu_backend(rng):
    for H, I, E, k, T in ((64, 32, 8, 2, 5), (256, 128, 16, 6, 64), (512, 256, 32, 6, 300)):
        cfg = make_config(H, I, E, k, 1)
        t = make_tensors(cfg, rng)
        gpu = nvfp4moe.Moe.from_tensors(cfg, device="cuda", **t)
        cpu = nvfp4moe.Moe.from_tensors(cfg, device="cpu", **t)
        x = torch.randn(T, H) * 2
        y, ids, w = gpu.forward(x.cuda(), return_topk=True)
        torch.cuda.synchronize()
        y_cpu, ids_cpu, w_cpu = cpu.forward(x.numpy(), return_topk=True)
        np.testing.assert_array_equal(ids.cpu().numpy(), ids_cpu)
        assert spec_ref.rel_l2(y.float().cpu().numpy(), y_cpu) <= 1e-2
        assert torch.isfinite(y).all()
        ids_ref, w_ref = spec_ref.route(x.numpy(), t["router_gate"], t["router_bias"], k, cfg.routed_scaling_factor)
        from moe_factory import reference

        assert spec_ref.rel_l2(y.float().cpu().numpy(), reference(cfg, t, x.numpy(), ids_ref, w_ref)) <= 1e-2


@requires_cuda
def test_gpu_ops_and_compile(rng):
    m, _ = _module(rng, "cuda")
    x = torch.randn(4, 9, 64, device="cuda", dtype=torch.bfloat16)
    y = m(x)
    torch.library.opcheck(torch.ops.nvfp4moe.moe_forward.default, (m.handle, x.reshape(-1, 64), None, None, None))
    compiled = torch.compile(m, fullgraph=True)
    assert torch.equal(compiled(x), y)
    # A compiled function mixing torch ops with both custom ops.
    def f(h):
        h = torch.nn.functional.rms_norm(h, (64,))
        c, s, g = nt.quantize(h.reshape(-1, 64))
        return m(h), c, s, g

    eager = f(x)
    got = torch.compile(f, fullgraph=True)(x)
    for a, b in zip(got, eager):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


@requires_cuda
def test_cuda_graph_capture_and_replay(rng):
    m, _ = _module(rng, "cuda")
    static_x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the default stream, as torch requires
        for _ in range(2):
            m(static_x)
            nt.quantize(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = m(static_x)
        static_q = nt.quantize(static_x, "per_tensor", None, "swizzled")
    for _ in range(3):
        new_x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, m(new_x))
        want = nt.quantize(new_x, "per_tensor", None, "swizzled")
        for a, b in zip(static_q, want):
            assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                               b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


@requires_cuda
def test_vllm_adapter_matches_native_loader_gpu(tmp_path, rng):
    from test_vllm import _check_adapter_matches_native

    _check_adapter_matches_native(tmp_path, rng, "cuda")


def test_torch_cpu_bf16_and_readonly_inputs(rng):
    x = rng.standard_normal((6, 48)).astype(np.float32)
    xb = torch.from_numpy(x).to(torch.bfloat16)
    bits = xb.view(torch.int16).numpy().view(np.uint16)
    a = nvfp4moe.quantize(xb)
    b = nvfp4moe.quantize(bits)
    np.testing.assert_array_equal(a[0].numpy(), b[0])
    np.testing.assert_array_equal(a[1].view(torch.uint8).numpy(), b[1])
    ro = x.copy()
    ro.flags.writeable = False  # inputs may be read-only
    np.testing.assert_array_equal(nvfp4moe.quantize(ro)[0], nvfp4moe.quantize(x)[0])
    with pytest.raises(nvfp4moe.Error, match=r"x: must be contiguous"):
        nvfp4moe.quantize(xb.t().contiguous().t())  # a transposed view, not a copy
    # Gradients are not tracked through the library: tensors that require grad are detached.
    g = torch.from_numpy(x).requires_grad_()
    np.testing.assert_array_equal(nvfp4moe.quantize(g)[0].numpy(), nvfp4moe.quantize(x)[0])


@requires_cuda
def test_gpu_bad_inputs(rng):
    cfg = make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)
    moe = nvfp4moe.Moe.from_tensors(cfg, device="cuda", max_tokens=8, **t)
    with pytest.raises(nvfp4moe.Error, match=r"x: on cpu, but this Moe runs on cuda:0"):
        moe.forward(torch.zeros(2, 64))
    with pytest.raises(nvfp4moe.Error, match=r"(?s)9.*8|8.*9"):  # T above the capacity
        moe.forward(torch.zeros(9, 64, device="cuda"))
    x = torch.randn(4, 64, device="cuda")
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=torch.int32, device="cuda")
    w = torch.full((4, 2), 0.5, device="cuda")
    with pytest.raises(nvfp4moe.Error, match=r"topk_weights"):
        moe.forward(x, ids, w.cpu())
    with pytest.raises(nvfp4moe.Error, match=r"must be contiguous"):
        moe.forward(torch.randn(64, 4, device="cuda").t(), ids, w)
    # An expert id outside [-1, E) is skipped on the device and reported by sync_errors.
    good = ids.clone()
    good[1, 1] = -1
    y_good = moe.forward(x, good, w)
    bad = ids.clone()
    bad[1, 1] = 8
    y_bad = moe.forward(x, bad, w)
    with pytest.raises(nvfp4moe.Error, match=r"expert"):
        moe.sync_errors()
    moe.sync_errors()  # the error word was cleared
    assert torch.equal(y_bad, y_good)
    with pytest.raises(nvfp4moe.Error, match=r"x: K \(the last dimension\) must be a multiple of 16"):
        nt.quantize(torch.zeros(4, 40, device="cuda"))
    # A static scale given as a tensor (on either device) equals the number.
    xs = torch.randn(4, 32, device="cuda")
    want = nvfp4moe.quantize(xs, "static", 0.25)
    for g in (torch.full((1,), 0.25), torch.full((1,), 0.25, device="cuda")):
        for a, b in zip(nvfp4moe.quantize(xs, "static", g), want):
            assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                               b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    with pytest.raises(nvfp4moe.Error, match=r"global_scale: a static global scale must be finite and > 0, got -1"):
        nvfp4moe.quantize(xs, "static", torch.full((1,), -1.0, device="cuda"))
