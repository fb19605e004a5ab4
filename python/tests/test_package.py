"""The installed package: its library, version, and the numpy-level API over the C calls."""
import os
import re
import threading

import numpy as np
import pytest

import ringattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version_is_the_c_librarys():
    header = open(os.path.join(ROOT, "include", "ringattn.h")).read()
    parts = [re.search(r"RINGATTN_VERSION_%s (\d+)" % p, header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert ringattn.__version__ == ".".join(parts)
    if "RINGATTN_LIBRARY" not in os.environ:  # the wheel carries its own library
        assert os.path.dirname(ringattn.library_path()) == os.path.dirname(ringattn.__file__)


def test_cpu_kernels_follow_this_cpu():
    # the wheel is built without -march=native: its element-wise loops pick the CPU's level
    if "RINGATTN_LIBRARY" in os.environ:
        pytest.skip("a library built elsewhere (RINGATTN_LIBRARY)")
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    v4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    v3 = {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"} <= flags
    want = "x86-64-v4" if v4 and v3 else "x86-64-v3" if v3 else "x86-64 "
    assert ringattn.cpu_kernels().startswith(want), ringattn.cpu_kernels()
    assert "chosen at run time" in ringattn.cpu_kernels()
    if "RINGATTN_CPU_GEMM" not in os.environ:  # bfloat16 plans take AVX512-BF16 where it is
        bf16 = v4 and "avx512_bf16" in flags
        assert ("bfloat16 AVX512-BF16" in ringattn.cpu_kernels()) == bf16, ringattn.cpu_kernels()


def test_numpy_forward_backward_and_plan_info():
    rng = np.random.default_rng(0)
    plan = ringattn.Plan([0, 30, 44], 4, 16, num_kv_heads=2, causal=True, window=(9, -1))
    q = rng.standard_normal((44, 4, 16), dtype=np.float32)
    k, v = (rng.standard_normal((44, 2, 16), dtype=np.float32) for _ in range(2))
    out, lse = plan.forward(q, k, v)
    assert out.shape == (44, 4, 16) and lse.shape == (4, 44) and np.isfinite(out).all()
    # row 0 attends only itself: O = v of its kv head, LSE = its scaled logit
    assert np.allclose(out[0, 0], v[0, 0], atol=1e-6)
    assert np.isclose(lse[0, 0], q[0, 0] @ k[0, 0] / 4.0, atol=1e-5)
    dq, dk, dv = plan.backward(q, k, v, out, lse, np.ones_like(out))
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))
    info = plan.info()
    assert info["ranks"] == 1 and info["local_tokens"] == 44 and info["memory_bytes"] > 0


def test_precision_levels():
    # SPEC 9's two levels for the half dtypes; anything else is refused before the C call
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((40, 2, 16)).astype(np.float16) for _ in range(3))
    outs = []
    for level in ("default", "high"):
        plan = ringattn.Plan([0, 40], 2, 16, dtype="float16", causal=True, precision=level)
        out, lse = plan.forward(q, k, v)
        assert np.isfinite(out.astype(np.float32)).all() and np.isfinite(lse).all()
        outs.append(out.astype(np.float32))
    assert np.allclose(outs[0], outs[1], atol=2e-3)
    with pytest.raises(ringattn.InvalidArgumentError, match="precision"):
        ringattn.Plan([0, 40], 2, 16, dtype="float16", precision="exact")


def test_strided_views_are_read_in_place():
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((20, 3, 2, 8), dtype=np.float32)  # a fused QKV projection
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    plan = ringattn.Plan([0, 20], 2, 8)
    out, _ = plan.forward(q, k, v)
    ref, _ = plan.forward(*(np.ascontiguousarray(x) for x in (q, k, v)))
    assert np.array_equal(out, ref)


def test_scatter_gather_and_positions_over_a_threads_ring():
    cu = [0, 7, 19]
    comms = ringattn.Comm.threads(2)
    assert [(c.rank, c.size) for c in comms] == [(0, 2), (1, 2)]
    plans = [None, None]
    threads = [threading.Thread(target=lambda r: plans.__setitem__(r, ringattn.Plan(
        cu, 1, 4, layout="zigzag", comm=comms[r])), args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    x = np.arange(19 * 4, dtype=np.float32).reshape(19, 1, 4)
    whole = np.zeros_like(x)
    seen = []
    for p in plans:
        local = p.scatter(x)
        assert np.array_equal(local, x[p.local_tokens()])
        p.gather(local, out=whole)
        seen += list(p.local_tokens())
        seq = np.searchsorted(cu, p.local_tokens(), side="right") - 1
        assert np.array_equal(p.positions(), p.local_tokens() - np.array(cu)[seq])
    assert sorted(seen) == list(range(19)) and np.array_equal(whole, x)
    for c in comms:
        c.close()
    with pytest.raises(ringattn.UsageError):
        plans[0].info()  # closed with its comm


def test_closed_objects_are_refused():
    plan = ringattn.Plan([0, 4], 1, 4)
    plan.close()
    plan.close()  # idempotent
    with pytest.raises(ringattn.UsageError, match="closed"):
        plan.forward(*(np.zeros((4, 1, 4), np.float32) for _ in range(3)))


def test_numpy_broadcast_views():
    """A stride of 0 is packed in the C API: broadcast inputs are copied, broadcast outputs refused."""
    rng = np.random.default_rng(28)
    plan = ringattn.Plan([0, 30], 4, 16, num_kv_heads=2, causal=True)
    q = np.broadcast_to(rng.standard_normal((1, 4, 16), dtype=np.float32), (30, 4, 16))
    k = np.broadcast_to(rng.standard_normal((30, 1, 16), dtype=np.float32), (30, 2, 16))
    v = rng.standard_normal((30, 2, 16), dtype=np.float32)
    out, lse = plan.forward(q, k, v)
    ref_out, ref_lse = plan.forward(q.copy(), k.copy(), v)
    assert np.array_equal(out, ref_out) and np.array_equal(lse, ref_lse)
    dout = np.broadcast_to(np.ones((30, 1, 16), dtype=np.float32), (30, 4, 16))
    got = plan.backward(q, k, v, out, lse, dout)
    want = plan.backward(q.copy(), k.copy(), v, out, lse, dout.copy())
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    with pytest.raises(ringattn.InvalidArgumentError, match="broadcast view"):
        plan._tensor("o", np.broadcast_to(out[:1], out.shape))
