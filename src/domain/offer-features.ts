/**
 * Features a verification run can prove of an offer's endpoint, beyond the checks every offer
 * must pass (adapters/upstream/probe.ts): `tools` (a tool call answered), `json_schema` (a
 * `response_format` JSON schema answered with parseable JSON), `stream_usage` (a stream carried
 * usage), `logprobs` (a temperature-0 completion asked for log-probabilities answered ones that
 * spell its text and pass audits/logprobs.ts's checks). `provider.require_parameters` routes a
 * request only to offers that proved every feature it uses (DESIGN.md section 9).
 */
export const offerFeatures = ["tools", "json_schema", "stream_usage", "logprobs"] as const;
export type OfferFeature = (typeof offerFeatures)[number];

export function isOfferFeature(value: string): value is OfferFeature {
  return (offerFeatures as readonly string[]).includes(value);
}
