#!/usr/bin/env python3
"""Stand-in for the real service: prints the APP_* settings it was started with, as JSON."""
import json, os
print(json.dumps({k: v for k, v in sorted(os.environ.items()) if k.startswith("APP_")}))
