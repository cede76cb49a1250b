"""A stop signal that lands inside a finalizer is not lost (launcher/stops.py)."""

from __future__ import annotations

import signal as signals
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, os, signal, sys
    from launcher import stops

    stops.install()

    class Finalized:
        def __del__(self):  # the signal arrives while the garbage collector runs this
            os.kill(os.getpid(), signal.{signal})
            for _ in range(1000):  # Python runs the handler between these bytecodes
                pass

    Finalized()
    gc.collect()
    print("carried on", flush=True)
    try:
        stops.honour()
    except {exception}:
        print("honoured", flush=True)
        sys.exit(7)
    """
)


def as_at_a_terminal() -> None:
    """SIGINT at its default, as a terminal starts a command (a test suite started in the background, `make test &`,
    inherits it ignored, and install() then leaves it so)."""
    signals.signal(signals.SIGINT, signals.SIG_DFL)


def run(signal: str, exception: str) -> subprocess.CompletedProcess:
    code = SCRIPT.format(signal=signal, exception=exception)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=as_at_a_terminal
    )


def test_a_ctrl_c_swallowed_by_a_finalizer_is_raised_again_without_a_traceback():
    proc = run("SIGINT", "KeyboardInterrupt")
    assert proc.stdout.splitlines() == ["carried on", "honoured"] and proc.returncode == 7, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_a_sigterm_swallowed_by_a_finalizer_is_raised_again():
    proc = run("SIGTERM", "stops.Terminated")
    assert proc.stdout.splitlines() == ["carried on", "honoured"] and proc.returncode == 7, proc.stderr


def test_a_ctrl_c_ignored_by_the_parent_stays_ignored():
    """A background job of a script starts with SIGINT ignored; install() leaves it so, as Python does."""
    code = "import signal\nfrom launcher import stops\nstops.install()\nprint(signal.getsignal(signal.SIGINT))"
    ignored = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signals.signal(signals.SIGINT, signals.SIG_IGN),
    )
    assert ignored.stdout.strip() == str(signals.SIG_IGN.value), ignored.stderr  # printed as 1


def test_nothing_is_raised_when_no_stop_arrived():
    code = "from launcher import stops\nstops.install()\nstops.honour()\nprint('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "ok\n" and proc.returncode == 0, proc.stderr


def test_other_unraisable_exceptions_are_still_printed():
    code = textwrap.dedent(
        """
        from launcher import stops
        stops.install()
        class Broken:
            def __del__(self):
                raise ValueError("from a finalizer")
        Broken()
        stops.honour()
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ValueError: from a finalizer" in proc.stderr
