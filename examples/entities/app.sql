-- The example application database: python examples/entities/make_app_db.py
CREATE TABLE users (
    id                INTEGER PRIMARY KEY,
    username          TEXT NOT NULL UNIQUE,
    email             TEXT NOT NULL,
    role              TEXT NOT NULL DEFAULT 'customer',
    city              TEXT,
    password_hash     TEXT NOT NULL DEFAULT '',
    email_verified_at TEXT,
    created_at        TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE orders (
    id          INTEGER PRIMARY KEY,
    user_id     INTEGER NOT NULL REFERENCES users (id),
    status      TEXT NOT NULL DEFAULT 'new',
    total_cents INTEGER NOT NULL,
    note        TEXT,
    created_at  TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
INSERT INTO users (id, username, email, role, city, password_hash, created_at) VALUES
    (1, 'ada',   'ada@example.com',   'customer', 'London', 'pbkdf2$ada',   '2026-01-05 10:00:00'),
    (2, 'linus', 'linus@example.com', 'customer', 'Helsinki', 'pbkdf2$linus', '2026-01-06 11:30:00'),
    (3, 'grace', 'grace@example.com', 'staff',    'Arlington', 'pbkdf2$grace', '2026-01-07 09:15:00');
INSERT INTO orders (id, user_id, status, total_cents, note, created_at) VALUES
    (1, 1, 'paid',    4200, NULL,                 '2026-02-01 08:00:00'),
    (2, 1, 'shipped', 1999, 'gift wrap',          '2026-02-03 12:00:00'),
    (3, 2, 'new',     750,  NULL,                 '2026-02-04 16:45:00'),
    (4, 3, 'paid',    12000, 'call before delivery', '2026-02-05 09:30:00');
