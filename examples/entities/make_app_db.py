"""Create examples/entities/app.db from app.sql (replacing an existing one)."""

import sqlite3
from pathlib import Path

here = Path(__file__).resolve().parent
target = here / "app.db"
target.unlink(missing_ok=True)
with sqlite3.connect(target) as conn:
    conn.executescript((here / "app.sql").read_text(encoding="utf-8"))
print(f"wrote {target}")
