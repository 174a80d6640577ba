"""hvdsync.launch.hosts on strings: Horovod's -H and hostfile syntax (checked against Horovod 0.28.1's own parser where
it has one), Slurm node lists and task counts (examples from Slurm's man pages), and the checks before launch."""
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdsync.config import ConfigError
from hvdsync.launch.hosts import (MAX_NODES, Host, check_duplicates, check_slots, expand_nodelist, loopback_problem,
                                  parse_hostfile, parse_hosts, read_hostfile, slurm_hosts, tasks_per_node, to_horovod)

H = Host


# --- -H ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("a:2,b:2", [H("a", 2), H("b", 2)]),
    ("a", [H("a", 1)]),                                    # no :N -> 1 slot
    ("a:2, b", [H("a", 2), H("b", 1)]),
    ("  a:2 ,  b:3  ", [H("a", 2), H("b", 3)]),            # Horovod strips each entry
    ("10.0.0.1:4,10.0.0.2:4", [H("10.0.0.1", 4), H("10.0.0.2", 4)]),
    ("node-1.example.com:8", [H("node-1.example.com", 8)]),
    ("worker_0:02", [H("worker_0", 2)]),                   # [0-9]+ then int(), as Horovod
    ("A-1:1,a-1:1", [H("A-1", 1), H("a-1", 1)]),           # names are case-sensitive, as in Horovod
])
def test_parse_hosts(text, hosts):
    assert parse_hosts(text) == hosts


@pytest.mark.parametrize("text, words", [
    ("", ["--hosts: entry 1 is empty"]),
    ("a:2,,b:2", ["entry 2 is empty", "a:2,b:2"]),
    ("a:2,", ["entry 2 is empty"]),
    ("a:x", ["entry 1", "'a:x' is not allowed"]),
    ("a:2:3", ["'a:2:3'"]),
    ("a:-1", ["'a:-1'"]),
    ("a:2,fe80::1:2", ["entry 2", "'fe80::1:2'", "not IPv6"]),
    ("a b:2", ["'a b:2'"]),
    ("a/b:2", ["'a/b:2'", "letters, digits"]),
    ("a:0", ["--hosts entry 1", "host 'a' has 0 slots", "at least 1"]),
    ("b:1,-oProxyCommand:1", ["entry 2", "'-oProxyCommand' starts with '-'"]),
    ("a:2,b:1,a:1", ["--hosts: host 'a' at entry 3 is already at entry 1", "list each host once"]),
])
def test_parse_hosts_errors(text, words):
    with pytest.raises(ConfigError) as error:
        parse_hosts(text)
    for word in words:
        assert word in str(error.value)


def test_parse_hosts_names_the_option_it_came_from():
    with pytest.raises(ConfigError, match=r"^--set launch.hosts: entry 1"):
        parse_hosts("a:x", source="--set launch.hosts")


# --- hostfile ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("a slots=2\nb slots=4\n", [H("a", 2), H("b", 4)]),
    ("a slots=2", [H("a", 2)]),                                          # no final newline
    ("# cluster\n\na slots=2   # the big one\n  \n\tb\tslots=1\n", [H("a", 2), H("b", 1)]),
    ("a slots=2\r\nb slots=3\r\n", [H("a", 2), H("b", 3)]),              # written on Windows
    ("  10.0.0.1   slots=8  \n10.0.0.2 slots=08\n", [H("10.0.0.1", 8), H("10.0.0.2", 8)]),
    ("node-1.example.com slots=1\n#b slots=9\n", [H("node-1.example.com", 1)]),
])
def test_parse_hostfile(text, hosts):
    assert parse_hostfile(text) == hosts


@pytest.mark.parametrize("text, line, words", [
    ("a slots=2\nb\n", 2, ["'b'", "the slots are missing"]),
    ("a:2\n", 1, ["'a:2'", "host:slots form belongs to --hosts"]),
    ("a slots=2\n\nb slots=2 max_slots=4\n", 3, ["'b slots=2 max_slots=4'", "3 words"]),
    ("a max_slots=4\n", 1, ["'max_slots=4' is not slots=<N>"]),
    ("a foo=3\n", 1, ["'foo=3' is not slots=<N>"]),           # Horovod would read this as a:3
    ("a slots = 2\n", 1, ["'a slots = 2'", "4 words"]),
    ("a slots=x\n", 1, ["'slots=x' is not slots=<N>"]),
    ("a slots=2=3\n", 1, ["'slots=2=3'"]),
    ("a slots=-1\n", 1, ["'slots=-1'"]),
    ("# hosts\na/b slots=2\n", 2, ["'a/b slots=2'", "host names are letters"]),
    ("a slots=0\n", 1, ["host 'a' has 0 slots"]),
    ("-oProxyCommand slots=1\n", 1, ["starts with '-'"]),
])
def test_parse_hostfile_errors_name_the_file_line_and_text(text, line, words):
    with pytest.raises(ConfigError) as error:
        parse_hostfile(text, source="hosts.txt")
    message = str(error.value)
    assert message.startswith(f"hosts.txt, line {line}: ")
    for word in words:
        assert word in message
    # Syntax errors say what a line looks like; a well-formed line with a bad value says what to change.
    assert ("expected '<host> slots=<N>' per line" in message) == ("has 0 slots" not in message
                                                                   and "starts with '-'" not in message)


@pytest.mark.parametrize("text, words", [
    ("", ["hosts.txt: no hosts in the file", "expected '<host> slots=<N>'"]),
    ("# nothing yet\n\n", ["no hosts in the file"]),
    ("a slots=1\nb slots=1\n\na slots=2\n", ["hosts.txt: host 'a' at line 4 is already at line 1"]),
])
def test_parse_hostfile_whole_file_errors(text, words):
    with pytest.raises(ConfigError) as error:
        parse_hostfile(text, source="hosts.txt")
    for word in words:
        assert word in str(error.value)


def test_read_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# two hosts\na slots=2\nb slots=2\n")
    assert read_hostfile(path) == [H("a", 2), H("b", 2)]
    path.write_text("a slots=2\nb slots\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}, line 2: 'b slots': "):
        read_hostfile(str(path))


def test_read_hostfile_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=r"--hostfile: .*nope' cannot be read \(No such file"):
        read_hostfile(missing)


# Horovod 0.28.1's own readers: a hostfile it reads correctly, and an -H string it accepts, give the same hosts here.
try:
    from horovod.runner.common.util import hosts as horovod_hosts
except ImportError:  # the parsers above are tested all the same
    horovod_hosts = None
needs_horovod = pytest.mark.skipif(horovod_hosts is None, reason="Horovod is not installed")


@pytest.mark.parametrize("text", ["a slots=2\nb slots=4\n", "  10.0.0.1   slots=8  \n10.0.0.2 slots=08",
                                  "node-1.example.com slots=1\nworker_2 slots=3\n"])
@needs_horovod
def test_hostfile_agrees_with_horovod(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    names, slots = horovod_hosts.parse_hosts_and_slots(horovod_hosts.parse_host_files(str(path)))
    assert read_hostfile(path) == [H(name, slots[name]) for name in names]


@pytest.mark.parametrize("text", ["# a comment\na slots=2\n", "a slots=2\n\n", "a\n"])
@needs_horovod
def test_horovod_crashes_where_we_give_a_line(tmp_path, text):
    # What Horovod's reader does with these (why hvdsync reads hostfiles itself): a bare IndexError, no line number.
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(IndexError):
        horovod_hosts.parse_host_files(str(path))


@needs_horovod
def test_horovod_needs_slots_in_dash_h_so_to_horovod_always_writes_them():
    with pytest.raises(ValueError, match="Invalid host input"):
        horovod_hosts.parse_hosts_and_slots("a,b")
    assert to_horovod(parse_hosts("a,b:3")) == "a:1,b:3"
    assert horovod_hosts.parse_hosts_and_slots(to_horovod(parse_hosts("a,b:3"))) == (["a", "b"], {"a": 1, "b": 3})


names = st.from_regex(r"[a-z][a-z0-9_.]{0,8}(-[a-z0-9]{1,3})?", fullmatch=True)
host_lists = st.lists(st.builds(Host, names, st.integers(1, 64)), min_size=1, max_size=8,
                      unique_by=lambda host: host.name)


@settings(max_examples=200, deadline=None)
@given(host_lists)
def test_round_trips(hosts):
    assert parse_hosts(to_horovod(hosts)) == hosts
    assert parse_hostfile("".join(f"{host.name} slots={host.slots}\n" for host in hosts)) == hosts


@needs_horovod
@settings(max_examples=200, deadline=None)
@given(host_lists)
def test_generated_hosts_agree_with_horovod(tmp_path_factory, hosts):
    names_, slots = horovod_hosts.parse_hosts_and_slots(to_horovod(hosts))
    assert [H(name, slots[name]) for name in names_] == hosts
    path = tmp_path_factory.mktemp("hf") / "hostfile"
    path.write_text("".join(f"{host.name} slots={host.slots}\n" for host in hosts))
    assert horovod_hosts.parse_host_files(str(path)) == to_horovod(hosts)
    assert read_hostfile(path) == hosts


# --- Slurm node lists ----------------------------------------------------------------------------------------------

def n(prefix, numbers, suffix=""):
    return [f"{prefix}{number}{suffix}" for number in numbers]


@pytest.mark.parametrize("text, expected", [
    # From Slurm's man pages: scontrol(1) hostnames/hostlist, slurm.conf(5) NodeName.
    ("tux[1-3]", ["tux1", "tux2", "tux3"]),
    ("tux[2,1-2]", ["tux2", "tux1", "tux2"]),                 # scontrol neither sorts nor de-duplicates
    ("linux[0-64,128]", n("linux", range(65)) + ["linux128"]),
    ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
    ("linux[0000-1023]", n("linux", (f"{i:04d}" for i in range(1024)))),
    ("rack[0-1]_blade[0-2]", ["rack0_blade0", "rack0_blade1", "rack0_blade2",
                              "rack1_blade0", "rack1_blade1", "rack1_blade2"]),
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    # The brief's and the examples.
    ("node[01-04,07],gpu5,rack[1-2]-n[1-2]", ["node01", "node02", "node03", "node04", "node07", "gpu5",
                                              "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("linux[0-3,7]", ["linux0", "linux1", "linux2", "linux3", "linux7"]),
    ("tux[1,3-4]", ["tux1", "tux3", "tux4"]),
    ("node[001-003]", ["node001", "node002", "node003"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    # Padding is the width of the low end as written (hostlist.c: width = strlen(lo)).
    ("node[1-10]", n("node", range(1, 11))),
    ("node[08-10]", ["node08", "node09", "node10"]),
    ("node[98-101]", ["node98", "node99", "node100", "node101"]),
    ("node[001-3]", ["node001", "node002", "node003"]),
    ("node[7]", ["node7"]),
    ("node[3,1]", ["node3", "node1"]),                           # order as written
    # Three groups: Slurm's _push_range_list recurses from the prefix's last group, so the middle one varies slowest.
    ("a[1-2]b[3-4]c[5-6]", ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("n[1-2].cluster.org,login", ["n1.cluster.org", "n2.cluster.org", "login"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    # Separators are commas and whitespace, outside brackets; empty tokens are skipped.
    ("a b\tc\nd", ["a", "b", "c", "d"]),
    (",a,,b[1-2],", ["a", "b1", "b2"]),
])
def test_expand_nodelist(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text, words", [
    ("", ["names no hosts"]),
    (" , ", ["names no hosts"]),
    ("node[1-3", ["'[' out of place"]),
    ("node1-3]", ["']' out of place"]),
    ("node[[1-2]]", ["out of place", "do not nest"]),
    ("node[1-[2-3]]", ["out of place", "do not nest"]),
    ("a{1..3}", ["'{' out of place"]),
    ("node[]", ["range '' in 'node[]' is not allowed"]),
    ("node[3-1]", ["range '3-1'", "lo <= hi"]),
    ("node[1--3]", ["range '1--3'"]),
    ("node[a-b]", ["range 'a-b'"]),
    ("node[1-]", ["range '1-'"]),
    ("node[1,,2]", ["range ''"]),
    ("node[1 -2]", ["range '1 -2'"]),
    ("node[0-70000]", ["range '0-70000'", f"at most {MAX_NODES} hosts"]),
    ("a[0-999]b[0-999]", [f"expands to more than {MAX_NODES} hosts"]),
])
def test_expand_nodelist_errors(text, words):
    with pytest.raises(ConfigError) as error:
        expand_nodelist(text)
    assert str(error.value).startswith("SLURM_JOB_NODELIST: ")
    for word in words:
        assert word in str(error.value)


def test_expand_nodelist_names_the_variable_it_read():
    with pytest.raises(ConfigError, match=r"^SLURM_NODELIST: 'x\[' has '\['"):
        expand_nodelist("x[", variable="SLURM_NODELIST")


ranges = st.tuples(st.integers(0, 300), st.integers(0, 20), st.integers(1, 4))  # low, extra hosts, width


def group(parts):
    """A bracket group and its numbers, written as Slurm would: low end padded to its width, high end plain."""
    text = ",".join(f"{lo:0{width}d}" + (f"-{lo + extra}" if extra else "") for lo, extra, width in parts)
    return text, [f"{i:0{width}d}" for lo, extra, width in parts for i in range(lo, lo + extra + 1)]


@settings(max_examples=300, deadline=None)
@given(prefix=st.from_regex(r"[a-z][a-z0-9.-]{0,6}", fullmatch=True), suffix=st.from_regex(r"([-_.][a-z]{1,4})?",
       fullmatch=True), first=st.lists(ranges, min_size=1, max_size=4), second=st.one_of(st.none(),
       st.lists(ranges, min_size=1, max_size=3)), plain=st.lists(names, max_size=3))
def test_expand_equals_the_explicit_list(prefix, suffix, first, second, plain):
    text, numbers = group(first)
    expected = [prefix + number + suffix for number in numbers]
    expression = f"{prefix}[{text}]{suffix}"
    if second is not None:  # prefix[first]-x[second]suffix: the first group varies slowest
        text2, numbers2 = group(second)
        expected = [prefix + a + "-x" + b + suffix for a in numbers for b in numbers2]
        expression = f"{prefix}[{text}]-x[{text2}]{suffix}"
    assert expand_nodelist(",".join(plain + [expression])) == plain + expected


# --- Slurm task counts and the allocation --------------------------------------------------------------------------

@pytest.mark.parametrize("text, nodes, expected", [
    ("2(x3),1", 4, [2, 2, 2, 1]),                # sbatch(1)'s example
    ("4", 3, [4, 4, 4]),                         # one number: every node (SLURM_NTASKS_PER_NODE)
    ("8(x2)", 2, [8, 8]),
    ("1,2,3", 3, [1, 2, 3]),
    ("2(x1)", 1, [2]),
    (" 2(x2) , 1 ", 3, [2, 2, 1]),
])
def test_tasks_per_node(text, nodes, expected):
    assert tasks_per_node(text, nodes) == expected


@pytest.mark.parametrize("text, nodes, words", [
    ("2(x3),1", 3, ["'2(x3),1' describes 4 nodes but the node list has 3"]),
    ("2(x2)", 3, ["describes 2 nodes", "has 3"]),
    ("1,1", 3, ["describes 2 nodes"]),
    ("", 1, ["'' in '' is not allowed"]),
    ("0", 2, ["'0' in '0' is not allowed", "at least 1"]),
    ("2(x0)", 1, ["'2(x0)'"]),
    ("2(3)", 3, ["'2(3)'", "e.g. 2(x3),1"]),
    ("two", 1, ["'two'"]),
    ("2,", 1, ["'' in '2,'"]),
    ("-1", 1, ["'-1'"]),
])
def test_tasks_per_node_errors(text, nodes, words):
    with pytest.raises(ConfigError) as error:
        tasks_per_node(text, nodes)
    assert str(error.value).startswith("SLURM_TASKS_PER_NODE: ")
    for word in words:
        assert word in str(error.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=20))
def test_tasks_per_node_reads_what_slurm_writes(counts):
    runs = []  # Slurm's run-length form: consecutive equal counts become "c(xN)"
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    text = ",".join(f"{c}(x{r})" if r > 1 else f"{c}" for c, r in runs)
    assert tasks_per_node(text, len(counts)) == counts


@pytest.mark.parametrize("environ, hosts", [
    ({"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}, [H("node01", 2), H("node02", 2)]),
    ({"SLURM_NODELIST": "tux[1,3-4]", "SLURM_TASKS_PER_NODE": "2(x2),1"}, [H("tux1", 2), H("tux3", 2), H("tux4", 1)]),
    ({"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_NTASKS_PER_NODE": "4"}, [H("gpu1", 4), H("gpu2", 4)]),
    ({"SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS_PER_NODE": "3"},
     [H("a", 3), H("b", 1)]),                   # the per-node layout wins
    ({"SLURM_JOB_NODELIST": "a", "SLURM_NODELIST": "b", "SLURM_TASKS_PER_NODE": "1"}, [H("a", 1)]),
    ({"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "b", "SLURM_TASKS_PER_NODE": "1"}, [H("b", 1)]),
])
def test_slurm_hosts(environ, hosts):
    assert slurm_hosts(environ) == hosts


@pytest.mark.parametrize("environ, words", [
    ({}, ["SLURM_JOB_NODELIST (or SLURM_NODELIST): not set", "sbatch or salloc"]),
    ({"SLURM_TASKS_PER_NODE": "2"}, ["SLURM_JOB_NODELIST (or SLURM_NODELIST): not set"]),
    ({"SLURM_JOB_NODELIST": "a"}, ["SLURM_TASKS_PER_NODE (or SLURM_NTASKS_PER_NODE): not set"]),
    ({"SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "  "}, ["SLURM_TASKS_PER_NODE (or"]),
    ({"SLURM_NODELIST": "node[1-", "SLURM_TASKS_PER_NODE": "1"}, ["SLURM_NODELIST: 'node[1-' has '['"]),
    ({"SLURM_JOB_NODELIST": "a,b", "SLURM_NTASKS_PER_NODE": "x"}, ["SLURM_NTASKS_PER_NODE: 'x'"]),
    ({"SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "2(x3)"}, ["SLURM_TASKS_PER_NODE: '2(x3)' describes 3"]),
    ({"SLURM_JOB_NODELIST": "tux[2,1-2]", "SLURM_TASKS_PER_NODE": "1"},
     ["SLURM_JOB_NODELIST: host 'tux2' at node 3 is already at node 1"]),
    ({"SLURM_JOB_NODELIST": "a/b", "SLURM_TASKS_PER_NODE": "1"}, ["SLURM_JOB_NODELIST: node 'a/b' is not a name"]),
])
def test_slurm_hosts_errors_name_the_variable(environ, words):
    with pytest.raises(ConfigError) as error:
        slurm_hosts(environ)
    for word in words:
        assert word in str(error.value)


def test_slurm_hosts_reads_the_process_environment(monkeypatch):
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[07-08]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "8(x2)")
    assert to_horovod(slurm_hosts()) == "node07:8,node08:8"


# --- checks before launch ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hosts, np", [([H("a", 2), H("b", 2)], 4), ([H("a", 2), H("b", 2)], 1), ([H("a")], 1)])
def test_check_slots_accepts(hosts, np):
    check_slots(hosts, np)


@pytest.mark.parametrize("hosts, np, words", [
    ([H("a", 2), H("b", 2)], 5, ["np: 5 processes asked but the hosts have 4 slots (a:2,b:2)", "lower -np to 4"]),
    ([H("a", 1)], 2, ["have 1 slots (a:1)"]),
    ([H("a", 2)], 0, ["np: 0 processes", "at least 1"]),
    ([], 1, ["on 0 hosts", "at least 1"]),
])
def test_check_slots_errors(hosts, np, words):
    with pytest.raises(ConfigError) as error:
        check_slots(hosts, np)
    for word in words:
        assert word in str(error.value)


def test_check_duplicates():
    assert check_duplicates([H("a"), H("b")]) == [H("a"), H("b")]
    with pytest.raises(ConfigError, match=r"^hosts: host 'a' at entry 3 is already at entry 1; list each host once"):
        check_duplicates([H("a"), H("b"), H("a", 2)])


def resolver(table):
    def resolve(name):
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[name]
    return resolve


DEBIAN = resolver({"here": "127.0.1.1"})
LOCALHOST = resolver({"here": "127.0.0.1"})
FIXED = resolver({"here": "192.0.2.1"})


@pytest.mark.parametrize("hosts, resolve, hostname, local_names, flagged", [
    ("here:2,b:2", DEBIAN, "here", (), True),                       # Debian/Ubuntu's 127.0.1.1 line, one remote host
    ("192.0.2.1:1,192.0.2.2:1", LOCALHOST, "here", (), True),       # the measured failure (hosts by address)
    ("a:2,b:2", DEBIAN, "here", (), True),                          # two other hosts: their /etc/hosts likely match
    ("here:2,b:2", resolver({"here": "::1"}), "here", (), True),    # IPv6 loopback too
    ("here:2,b:2", FIXED, "here", (), False),                       # the fix: the name maps to the link's address
    ("192.0.2.1:1,192.0.2.2:1", FIXED, "here", (), False),
    ("localhost:2", LOCALHOST, "here", (), False),                  # one machine: loopback is right
    ("here:2", DEBIAN, "here", (), False),
    ("here:2,localhost:1,127.0.0.1:1", DEBIAN, "here", (), False),  # several names, all this machine
    ("here:2", DEBIAN, "here.example.com", (), False),              # the short host name is this machine
    ("b:4", DEBIAN, "here", (), False),                             # all workers on one other host
    ("192.0.2.1:2,here:1", DEBIAN, "here", ("192.0.2.1",), False),  # this machine's address, given as local
    ("192.0.2.1:2,b:1", DEBIAN, "here", ("192.0.2.1",), True),
    ("here:2,b:2", resolver({}), "here", (), False),                # unresolvable: another check reports that
])
def test_loopback_problem(hosts, resolve, hostname, local_names, flagged):
    problem = loopback_problem(parse_hosts(hosts), hostname=hostname, resolve=resolve, local_names=local_names)
    assert (problem is not None) == flagged


def test_loopback_message_names_the_host_the_address_and_the_fix():
    problem = loopback_problem(parse_hosts("here:2,b:2,c:2"), hostname="here", resolve=DEBIAN)
    assert problem.startswith("host name 'here' of this machine resolves to 127.0.1.1 (loopback)")
    for word in ["also runs on b, c", "gloo::IoException ... connect [127.0.1.1]", "On every host",
                 "/etc/hosts", "'127.0.1.1 here'", "--network-interface alone does not fix this"]:
        assert word in problem
    assert "\n" not in problem


def test_loopback_defaults_ask_this_machine(monkeypatch):
    # The host name defaults to socket.gethostname(), asked at call time: a stand-in here, and no lookup.
    monkeypatch.setattr(socket, "gethostname", lambda: "here")
    assert loopback_problem([H("here", 2)]) is None
    assert loopback_problem([H("here", 2), H("b", 2)], resolve=DEBIAN) is not None


def test_to_horovod():
    assert to_horovod([H("a", 2), H("10.0.0.2", 4)]) == "a:2,10.0.0.2:4"
    assert to_horovod([]) == ""
    assert str(H("a")) == "a:1"
