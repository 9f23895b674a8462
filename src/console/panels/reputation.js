/**
 * An offer's reputation as the catalog publishes it (`offer.reputation`, docs/decisions/providers-and-routing.md
 * "Offer reputation"): the score and rates in basis points (10000 = 100 %), the median time to
 * first token and output speed over streamed answers, flagged requests, over `requests`
 * requests in the last `window_seconds`; a measure without data in the window is null. And a
 * chart comparing the offers of a model on latency and throughput: the API gives each offer's
 * current medians, no history, so the chart is bars across offers, not a line over time.
 */
import { code, facts, h, svg, table } from "../dom.js";

/** Basis points as a percentage (exact: 9850 -> "98.50 %"); null as "no data". @param {unknown} bps */
function percent(bps) {
  if (typeof bps !== "number") return "no data";
  return `${Math.floor(bps / 100)}.${String(bps % 100).padStart(2, "0")} %`;
}

/** @param {unknown} value @param {string} unit */
function measure(value, unit) {
  return typeof value === "number" ? `${value}${unit}` : "no data";
}

/**
 * @param {Record<string, unknown> | null | undefined} reputation
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
  const r = reputation;
  return h(
    "div",
    { class: "reputation", "data-reputation": "present" },
    h("h5", {}, "Reputation"),
    facts([
      ["Score", typeof r.score === "number" ? `${r.score} of 10000` : "no score yet", "score"],
      ["Success rate", percent(r.success_rate_bps), "success_rate"],
      ["Time to first token (median)", measure(r.time_to_first_token_ms, " ms"), "ttft"],
      ["Output speed (median)", measure(r.output_tokens_per_second, " tokens/s"), "tps"],
      ["Verification pass rate", percent(r.verification_pass_rate_bps), "verification"],
      ["Flagged requests", measure(r.flags, ""), "flags"],
      ["Requests counted", measure(r.requests, ""), "requests"],
      ["Window", measure(r.window_seconds, " s"), "window"],
    ]),
  );
}

/**
 * The offer's usage claims against the gateway's count (`offer.usage_divergence`,
 * docs/decisions/metering-and-tokens.md "Usage divergence"): flagged offers are routed last, excluded ones not at
 * all until their operator verifies again. `data-divergence` is `none`, `flagged` or `excluded`.
 * @param {Record<string, unknown> | null | undefined} divergence
 */
export function divergenceView(divergence) {
  if (divergence === undefined || divergence === null) return null;
  const d = divergence;
  const state = d.excluded === true ? "excluded" : d.flagged === true ? "flagged" : "none";
  const verdict = {
    excluded:
      "Excluded: more than half of its usage claims ran above the gateway's count. Out of routing until its operator verifies the offer again.",
    flagged:
      "Flagged: more than 10 % of its usage claims ran above the gateway's count. Routed after every unflagged offer.",
    none: "Not flagged.",
  }[state];
  return h(
    "div",
    { class: "divergence", "data-divergence": state },
    h("h5", {}, "Usage claims"),
    h("p", { class: state === "none" ? "muted" : "warning", role: "status" }, verdict),
    facts([
      ["Answers with a usage claim", measure(d.claimed, ""), "claimed"],
      ["Claims above the gateway's count", measure(d.diverged, ""), "diverged"],
      ["Share", percent(d.share_bps), "share"],
    ]),
  );
}

/**
 * Bars of each offer's median time to first token and output speed, with a table of the same
 * numbers; offers without data in the window say so.
 * @param {Record<string, any>[]} offers
 */
export function reputationChart(offers) {
  const rows = offers.map((o) => ({
    id: String(o.offer_id),
    ttft: o.reputation?.time_to_first_token_ms ?? null,
    tps: o.reputation?.output_tokens_per_second ?? null,
  }));
  return h(
    "div",
    { class: "reputation-chart", "data-chart": "offers" },
    h("h4", {}, "Latency and throughput by offer"),
    h(
      "p",
      { class: "hint" },
      "Each offer's current median over the reputation window (the gateway keeps no history).",
    ),
    bars(
      "Time to first token, ms (shorter is better)",
      "ttft",
      rows.map((r) => [r.id, r.ttft]),
    ),
    bars(
      "Output speed, tokens/s (longer is better)",
      "tps",
      rows.map((r) => [r.id, r.tps]),
    ),
    table(
      "Latency and throughput by offer",
      ["Offer", "Time to first token (ms)", "Output speed (tokens/s)"],
      rows.map((r) => [
        code(r.id),
        r.ttft === null ? "no data" : String(r.ttft),
        r.tps === null ? "no data" : String(r.tps),
      ]),
      rows.map((r) => ({ "data-offer-row": r.id })),
    ),
  );
}

/**
 * One horizontal bar per offer (its id shortened in the drawing; the table has it whole).
 * @param {string} title
 * @param {string} name
 * @param {[string, number | null][]} values
 */
function bars(title, name, values) {
  const rowH = 26;
  const labelW = 120;
  const width = 600;
  const plotW = width - labelW - 90;
  const height = values.length * rowH + 8;
  const max = Math.max(1, ...values.map(([, v]) => v ?? 0));
  const described = values
    .map(([id, v]) => `offer ${id.slice(0, 10)}…: ${v === null ? "no data" : v}`)
    .join("; ");
  const chart = svg(
    "svg",
    {
      viewBox: `0 0 ${width} ${height}`,
      class: "chart bars",
      role: "img",
      "aria-label": `${title}: ${described}.`,
      "data-bars": name,
    },
    ...values.flatMap(([id, v], i) => {
      const y = 4 + i * rowH;
      const w = v === null ? 0 : Math.max(2, (v / max) * plotW);
      return [
        svg("text", { x: 0, y: y + 16, class: "label" }, `${id.slice(0, 10)}…`),
        svg("rect", { x: labelW, y: y + 3, width: w, height: rowH - 8, class: "bar" }),
        svg(
          "text",
          { x: labelW + w + 6, y: y + 16, class: "label" },
          v === null ? "no data" : String(v),
        ),
      ];
    }),
  );
  return h("figure", { class: "chart-figure" }, h("figcaption", {}, title), chart);
}
