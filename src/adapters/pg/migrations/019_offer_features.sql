-- Provider preferences (DESIGN.md section 9, docs/decisions/providers-and-routing.md "Provider preferences").
--
-- The features a verification run proved of an offer's endpoint: `tools` (a tool call
-- answered), `json_schema` (a response_format json_schema answered with parseable JSON),
-- `stream_usage` (a stream carried usage). `provider.require_parameters` routes only to offers
-- that proved every feature a request uses. A successful run writes what it proved (a feature
-- whose check got no answer keeps its standing value); a wrong answer or a re-registration
-- clears the list.
ALTER TABLE provider_endpoints ADD COLUMN verified_features text[] NOT NULL DEFAULT '{}';

-- What each gateway process measured of the offers it served (`provider.sort` by latency or
-- throughput): moving averages kept in memory, written here every few seconds by each process
-- (one row per process and offer, never one write per request) and read back by the others.
-- Rows not written for a while (a stopped process) are ignored by readers and pruned.
CREATE TABLE offer_measurements (
  offer_id text NOT NULL,
  instance_id text NOT NULL,
  -- Time to first token, milliseconds.
  latency_ms double precision,
  -- Output tokens per second after the first token.
  throughput double precision,
  samples bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (offer_id, instance_id)
);
