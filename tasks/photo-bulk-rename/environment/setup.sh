#!/bin/bash
set -euo pipefail
mkdir -p "/app/photos/2024 Summer Trip/Day 1" "/app/photos/2024 Summer Trip/Day 2" "/app/photos/Birthday" "/app/photos/misc"
cd /app/photos
mk() { printf 'content of %s\n' "$1" > "$1"; }
mk "2024 Summer Trip/Day 1/IMG 0001.JPG"
mk "2024 Summer Trip/Day 1/IMG 0002.jpeg"
mk "2024 Summer Trip/Day 1/notes.TXT"
mk "2024 Summer Trip/Day 2/Beach Sunset.JPEG"
mk "2024 Summer Trip/Day 2/beach_sunset.jpg"
mk "2024 Summer Trip/Day 2/clip 01.MOV"
mk "Birthday/Cake.Jpg"
mk "Birthday/Party  Crowd.jpg"
mk "Birthday/already_ok.jpg"
mk "misc/scan.JPG.bak"
mk "misc/-dash start.JPG"
mk "misc/dots.in.name.JPEG"
mk "top level.JPG"
