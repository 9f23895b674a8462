/**
 * An offer's reputation, when the gateway publishes one (`offer.reputation`: score, success
 * rate, time to first token, output speed, verification pass rate, flags, over `requests`
 * requests in the last `window_seconds`). A gateway without it gets a marked empty place.
 */
import { facts, h } from "../dom.js";

/**
 * @param {Record<string, unknown> | undefined} reputation
 */
export function reputationView(reputation) {
  if (reputation === undefined || reputation === null) {
    return h(
      "div",
      { class: "reputation", "data-reputation": "absent" },
      h("h5", {}, "Reputation"),
      h("p", { class: "muted" }, "Not published by this gateway."),
    );
  }
  const r = /** @type {Record<string, unknown>} */ (reputation);
  const show = (value, unit = "") =>
    value === undefined || value === null ? undefined : `${String(value)}${unit}`;
  const percent = (value) =>
    typeof value === "number" ? `${(value * 100).toFixed(1)} %` : show(value);
  const flags = Array.isArray(r.flags) ? r.flags.map(String) : [];
  return h(
    "div",
    { class: "reputation", "data-reputation": "present" },
    h("h5", {}, "Reputation"),
    facts([
      ["Score", show(r.score)],
      ["Success rate", percent(r.success_rate)],
      ["Time to first token", show(r.time_to_first_token_ms, " ms")],
      ["Output speed", show(r.output_tokens_per_second, " tokens/s")],
      ["Verification pass rate", percent(r.verification_pass_rate)],
      ["Flags", flags.length === 0 ? "none" : flags.join(", ")],
      ["Requests", show(r.requests)],
      ["Window", show(r.window_seconds, " s")],
    ]),
  );
}
