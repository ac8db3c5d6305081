-- A server-keyed MAC over who a follow-up's turn runs as (and for which proposal and conversation), so a
-- row written around the store cannot make the turn run with other scopes or token claims. Rows from
-- before it have none, and are not followed up.
ALTER TABLE chat_followups ADD COLUMN actor_seal TEXT;
