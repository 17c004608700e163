"""pytest set-up for normlab's Python tests: a file whose every test skipped (PyTorch absent) ends
with exit code 77, which CTest reports as Skipped (SKIP_RETURN_CODE), not as passed; the `torch`
fixture skips a test that compares with PyTorch where it is not installed."""
import pytest

SKIPPED_EXIT_CODE = 77


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus not in (0, 5):  # 5: nothing collected (a module-level skip)
        return
    if reporter.stats.get("skipped") and not reporter.stats.get("passed"):
        session.exitstatus = SKIPPED_EXIT_CODE


@pytest.fixture
def torch(request):
    """PyTorch, for a test that compares with it; where it is not installed the test skips, its name in
    the reason (pytest -rs lists it)."""
    return pytest.importorskip("torch", reason=f"{request.node.name} compares with PyTorch, which is not installed")
