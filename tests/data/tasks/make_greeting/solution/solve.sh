#!/usr/bin/env bash
echo 'hello, sandbox' > /app/greeting.txt
