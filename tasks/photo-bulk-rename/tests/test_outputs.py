import os

EXPECTED = {
    "2024 Summer Trip/Day 1/img_0001.jpg": "2024 Summer Trip/Day 1/IMG 0001.JPG",
    "2024 Summer Trip/Day 1/img_0002.jpg": "2024 Summer Trip/Day 1/IMG 0002.jpeg",
    "2024 Summer Trip/Day 1/notes.TXT": "2024 Summer Trip/Day 1/notes.TXT",
    "2024 Summer Trip/Day 2/beach_sunset_dup.jpg": "2024 Summer Trip/Day 2/Beach Sunset.JPEG",
    "2024 Summer Trip/Day 2/beach_sunset.jpg": "2024 Summer Trip/Day 2/beach_sunset.jpg",
    "2024 Summer Trip/Day 2/clip 01.MOV": "2024 Summer Trip/Day 2/clip 01.MOV",
    "Birthday/cake.jpg": "Birthday/Cake.Jpg",
    "Birthday/party_crowd.jpg": "Birthday/Party  Crowd.jpg",
    "Birthday/already_ok.jpg": "Birthday/already_ok.jpg",
    "misc/scan.JPG.bak": "misc/scan.JPG.bak",
    "misc/-dash_start.jpg": "misc/-dash start.JPG",
    "misc/dots.in.name.jpg": "misc/dots.in.name.JPEG",
    "top_level.jpg": "top level.JPG",
}


def test_tree():
    got = {}
    for dp, dn, fn in os.walk("/app/photos"):
        for f in fn:
            p = os.path.join(dp, f)
            got[os.path.relpath(p, "/app/photos")] = open(p).read()
    assert sorted(got) == sorted(EXPECTED)
    for new, old in EXPECTED.items():
        assert got[new] == f"content of {old}\n", new
    assert sorted(os.listdir("/app/photos")) == ["2024 Summer Trip", "Birthday", "misc", "top_level.jpg"]
