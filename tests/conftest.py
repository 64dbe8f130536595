import sys
from pathlib import Path

# make tests/notebook_guard.py importable as a plain module
sys.path.insert(0, str(Path(__file__).parent))
