import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from files import KEEP  # noqa: E402

EXPECTED = dict(KEEP)
EXPECTED["projects/alpha/report.txt"] = "alpha report v2 (final)\n"
EXPECTED["projects/beta/new-results.csv"] = "id,score\n7,0.93\n"


def test_tree():
    got = {}
    for dp, dn, fn in os.walk("/app/data"):
        assert ".cache" not in dn, dp
        for f in fn:
            p = os.path.join(dp, f)
            got[os.path.relpath(p, "/app/data")] = open(p).read()
    assert sorted(got) == sorted(EXPECTED)
    for k, v in EXPECTED.items():
        assert got[k] == v, k


def test_backup_kept():
    assert os.path.getsize("/app/backups/data-2024-10-01.tar.gz") > 100
