"""Shared fixtures of the Python tests: a fresh seed per test (printed, and
fixed by NVFP4MOE_TEST_SEED to replay a failure), the built CLI, and
skip markers for torch and CUDA."""

import os
import random

import numpy as np
import pytest


@pytest.fixture
def seed(request):
    env = os.environ.get("NVFP4MOE_TEST_SEED")
    s = int(env) if env else random.SystemRandom().randrange(1 << 31)
    print(f"\n{request.node.name}: NVFP4MOE_TEST_SEED={s}")
    return s


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture
def cli():
    path = os.environ.get("NVFP4MOE_CLI")
    if not path or not os.path.exists(path):
        pytest.skip("NVFP4MOE_CLI does not point at the built nvfp4moe tool")
    return path


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


torch_or_none = _torch()
requires_torch = pytest.mark.skipif(torch_or_none is None, reason="torch is not installed")
requires_cuda = pytest.mark.skipif(
    torch_or_none is None or not torch_or_none.cuda.is_available(), reason="needs torch with a CUDA device")
