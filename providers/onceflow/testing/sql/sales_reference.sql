-- Named queries of the independent daily_sales reference (onceflow.testing.sales_backfill).
-- They restate the business rules of docs/daily-sales.md in plain SQL over the shop's orders
-- table, without onceflow's cleaning code, so a test can check the pipeline against something
-- it did not compute itself. PostgreSQL only.

-- name: day_totals_postgresql
-- One business day [:start_utc, :end_utc): source rows, rejected rows, orders (= rows of the
-- day's partition) and net cents in EUR. Rates: EUR 1, USD 0.92, GBP 1.17, SEK 0.087; each
-- event rounded half-even to cents; of duplicate events the latest ingested wins (then the
-- higher row_id); an event is a sale by order_id or a refund by refund_id; a row under the same
-- key that differs from the kept one as an event (order, refund id, customer, event time,
-- currency, amount value) is rejected (conflicting_duplicate). Processing version
-- sales-clean-v5 (onceflow.sales.clean.PROCESSING_VERSION): an amount may have more than two decimal
-- places if the extra digits are zeros (sub_cent_amount otherwise); a NULL differs from any text.
WITH day_events AS (
    SELECT * FROM orders WHERE created_at_utc >= :start_utc AND created_at_utc < :end_utc
),
valid AS (
    SELECT e.*, btrim(e.amount, E' \t\r\n') AS amount_text
    FROM day_events e
    -- Ids wider than the warehouse's varchar(64) columns are rejected (value_too_long). NUL
    -- bytes and text that is not UTF-8, also rejected by cleaning, cannot exist in PostgreSQL.
    WHERE coalesce(length(e.order_id), 0) <= 64
      AND coalesce(length(e.customer_id), 0) <= 64
      AND btrim(coalesce(e.order_id, ''), E' \t\r\n') <> ''
      AND e.event_type IN ('sale', 'refund')
      AND NOT (e.event_type = 'refund' AND btrim(coalesce(e.refund_id, ''), E' \t\r\n') = '')
      AND btrim(e.amount, E' \t\r\n') ~ '^-?[0-9]{1,12}(\.[0-9]{1,2}0*)?$'
      AND btrim(e.amount, E' \t\r\n')::numeric > 0
      AND e.currency IN ('EUR', 'USD', 'GBP', 'SEK')
),
latest AS (
    SELECT v.*, row_number() OVER w AS version,
        ROW(v.order_id, v.refund_id, v.customer_id, v.created_at_utc, v.currency,
            v.amount_text::numeric(14, 2))::text AS event,
        first_value(ROW(v.order_id, v.refund_id, v.customer_id, v.created_at_utc, v.currency,
            v.amount_text::numeric(14, 2))::text) OVER w AS kept_event
    FROM valid v
    WINDOW w AS (
        PARTITION BY v.event_type, CASE WHEN v.event_type = 'sale' THEN v.order_id ELSE v.refund_id END
        ORDER BY v.ingested_at_utc DESC, v.row_id DESC
    )
),
priced AS (
    SELECT order_id, event_type,
        amount_text::numeric * CASE currency
            WHEN 'EUR' THEN 1 WHEN 'USD' THEN 0.92 WHEN 'GBP' THEN 1.17 WHEN 'SEK' THEN 0.087
        END * 100 AS raw_cents
    FROM latest WHERE version = 1
),
cents AS (
    SELECT order_id, event_type,
        CASE WHEN raw_cents - floor(raw_cents) = 0.5
             THEN floor(raw_cents) + (floor(raw_cents)::bigint % 2)
             ELSE round(raw_cents) END::bigint AS cents
    FROM priced
)
SELECT
    (SELECT count(*) FROM day_events) AS source_rows,
    (SELECT count(*) FROM day_events) - (SELECT count(*) FROM valid)
        + (SELECT count(*) FROM latest WHERE version > 1 AND event <> kept_event) AS reject_count,
    (SELECT count(DISTINCT order_id) FROM cents) AS row_count,
    coalesce((SELECT sum(CASE WHEN event_type = 'sale' THEN cents ELSE -cents END) FROM cents), 0)
        AS net_cents
