-- One spelling per payment number. A Permit2 nonce is a uint256, and the
-- chain reads "0123" and "123" as one nonce; the attempt stored it as
-- written and was unique on that text, so one signature resent with its
-- nonce written "0…" bought a second task. From now on every number of a
-- payload is parsed and only its canonical decimal is taken (payload.rs);
-- this brings the rows already stored to that form, so the uniqueness on
-- (network, lower(asset), payer, nonce) is on the canonical nonce for them
-- too: a new payment can no longer slip past an old row by its spelling.
--
-- Only `upto` nonces can be off: `exact` nonces have been stored lowercase
-- since 0003, `valid_before` is NUMERIC, and `amount` and `charged` are
-- written by Reeve from the catalog and the meter.
--
-- Where rows differ only by such zeros (the bug already used), one of them
-- (the earliest) takes the canonical form, unless a row holds it already;
-- the others keep their text as history of what was bought. No new payment
-- can match them: only canonical nonces are taken now, and each collides
-- with the canonical row.
UPDATE payment_attempts a
   SET nonce = c.canonical, updated_at = now()
  FROM (SELECT DISTINCT ON (network, lower(asset), payer, canonical) id, canonical
          FROM (SELECT id, network, asset, payer, created_at,
                       COALESCE(NULLIF(ltrim(nonce, '0'), ''), '0') AS canonical
                  FROM payment_attempts
                 WHERE scheme = 'upto' AND nonce ~ '^0[0-9]+$') spelled
         ORDER BY network, lower(asset), payer, canonical, created_at, id) c
 WHERE a.id = c.id
   AND NOT EXISTS (SELECT 1 FROM payment_attempts b
                    WHERE b.network = a.network AND lower(b.asset) = lower(a.asset)
                      AND b.payer = a.payer AND b.nonce = c.canonical);
