"""The Slurm example launches what the docs say: its hvdsync command line parses with hvdsync's own parser, and in
a Slurm allocation's environment (the variables sbatch sets) the hosts and slots come out as the #SBATCH lines ask."""
import re
import shlex
from pathlib import Path

from hvdsync.launch import cli, hosts

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"


def _command(text):
    lines = text.replace("\\\n", " ").splitlines()
    line = next(x for x in lines if "hvdsync\" train" in x or "/hvdsync train" in x)
    # What the script passes on unset (HVDSYNC_IFACE) or given at submission ("$@", the user's own options) is left
    # out: the command as submitted without either.
    line = re.sub(r'\$\{HVDSYNC_IFACE:\+[^}]*\}|"\$@"', "", line)
    return shlex.split(line.split("train", 1)[1])


def test_sbatch_command_parses_and_its_hosts_match_the_allocation():
    text = SBATCH.read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", text, re.M).group(1))
    per_node = int(re.search(r"^#SBATCH --ntasks-per-node=(\d+)", text, re.M).group(1))
    env = {"SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]", "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
           "SLURM_NTASKS": str(nodes * per_node), "SLURM_SUBMIT_DIR": "/shared/project"}
    argv = [a.replace('"$SLURM_NTASKS"', env["SLURM_NTASKS"]).replace("$SLURM_NTASKS", env["SLURM_NTASKS"])
            .replace("$SLURM_SUBMIT_DIR", env["SLURM_SUBMIT_DIR"]) for a in _command(text)]
    ns = cli._parser().parse_args(["train", *argv])
    assert ns.hosts == "slurm" and int(ns.np) == nodes * per_node
    got = hosts.slurm_hosts(env)
    assert [str(h) for h in got] == [f"gpu{i:02d}:{per_node}" for i in range(1, nodes + 1)]
    hosts.check_slots(got, int(ns.np))                   # the job fills the allocation exactly
    cli._config(ns)                                      # and every --set is a valid config field
