import pytest

BACKENDS = ["c", "torch"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run a test with the fused C kernel and with the pure-torch path."""
    from stepscope.stats import backend_info

    if request.param == "c" and backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable: " + backend_info()["detail"])
    return request.param
