#!/bin/bash
# Load the service settings and start the service.
cd /app
export $(cat config/app.env)
APP_PORT=8000
exec python3 bin/app.py
