"""What `--ray` says where Ray is not installed: runs everywhere, Ray or not (the rest of tests/ray needs it)."""
import subprocess
import sys

from tests.ray.conftest import ROOT


def test_without_ray_installed_the_flag_says_how_to_get_it_in_one_line():
    # Needs no cluster and no Ray: `ray` made unimportable in a fresh interpreter.
    code = ("import sys; sys.modules['ray'] = None\nfrom hvdsync.launch.cli import main\n"
            "sys.exit(main(['train', '--ray', 'auto', '--no-track']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr == ("hvdsync: error: ray: Ray is not installed in this environment; "
                                                  "install it with pip install 'hvdsync[ray]'\n"), out.stderr
