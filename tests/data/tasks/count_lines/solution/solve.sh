#!/usr/bin/env bash
wc -l < /etc/os-release > /app/count.txt
