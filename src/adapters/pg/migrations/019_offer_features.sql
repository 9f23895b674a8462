-- Provider preferences (DESIGN.md section 9).
--
-- The features a verification run proved of an offer's endpoint: `tools` (a tool call
-- answered), `json_schema` (a response_format json_schema answered with parseable JSON),
-- `stream_usage` (a stream carried usage). `provider.require_parameters` routes only to offers
-- that proved every feature a request uses. A successful run writes what it proved (a feature
-- whose check got no answer keeps its standing value); a wrong answer or a re-registration
-- clears the list.
ALTER TABLE provider_endpoints ADD COLUMN verified_features text[] NOT NULL DEFAULT '{}';
