from pathlib import Path

SUBSCRIBERS = """aaron@beta.example.io
grace@beta.example.io
eve@corp.example.net
xena@corp.example.net
alice@example.com
bob.smith@example.com
frank+news@example.com
heidi@example.com
carol@mail.example.org
yann@alpha.example.io
zoe@alpha.example.io
"""


def sort_key(a):
    local, domain = a.split("@", 1)
    return (domain.encode(), local.encode())


def test_subscribers():
    want = sorted(SUBSCRIBERS.split(), key=sort_key)
    assert Path("/app/out/subscribers.txt").read_text() == "".join(a + "\n" for a in want)


def test_rejected():
    want = ["bad address@example.com", "ivan@@example.com", "not-an-email", "dave@example"]
    assert Path("/app/out/rejected.txt").read_text() == "".join(a + "\n" for a in want)
