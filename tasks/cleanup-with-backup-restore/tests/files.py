# path -> content ; shared by the environment builder (and mirrored in the verifier)
KEEP = {
    "projects/alpha/report.txt": "alpha report v1\n",
    "projects/alpha/tmpl/header.tmpl": "<header>{{title}}</header>\n",
    "projects/alpha/tmpl/footer.tmpl": "<footer/>\n",
    "projects/beta/notes.tmp.txt": "notes about tmp handling\n",
    "projects/beta/attempts.csv": "id,ok\n1,yes\n",
    "projects/gamma/cache_settings.json": '{"ttl": 60}\n',
    "projects/gamma/src/cached_view.py": "def view():\n    return 1\n",
    "projects/gamma/.cache.json": '{"note": "not a cache directory"}\n',
    "shared/tmpfiles.conf": "d /run/app 0755\n",
    "shared/readme.md": "# shared\n",
}
JUNK = {
    "projects/alpha/report.txt.tmp": "partial\n",
    "projects/alpha/.cache/index": "idx\n",
    "projects/alpha/.cache/blobs/0001": "blob\n",
    "projects/beta/upload.tmp": "x" * 2000 + "\n",
    "projects/gamma/.cache/pip/wheel.tmp": "w\n",
    "shared/.cache/thumbs": "t\n",
    "shared/export.TMP.tmp": "e\n",
}
