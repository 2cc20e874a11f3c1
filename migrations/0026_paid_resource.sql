-- The resource a payment paid for: its challenge's `resource.url`
-- (`https://<api>/v1/tasks/<kind>`, `mcp://tool/<tool>`, or a pay link's
-- `https://<api>/v1/pay-link`), recorded with the attempt when the payment
-- arrives and copied to its `payments` row when it is charged, so that a
-- signed receipt names what was paid whichever interface reads it (REST's
-- receipt route, MCP's `tasks/get`). NULL for a payment made before this
-- column: its receipt names the reader's resource, as it did then.
ALTER TABLE payment_attempts ADD COLUMN resource TEXT;
ALTER TABLE payments ADD COLUMN resource TEXT;
