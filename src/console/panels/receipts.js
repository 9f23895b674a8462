/**
 * A permit's receipts (GET /v1/permits/{id}/receipts, for API keys the permit's payer
 * authorized): its recent requests with their charge, tokens and settlement (batch and
 * transaction), and a chart of what it spent over time. The chart is drawn as SVG elements
 * (no markup, no inline style: the CSP refuses it) and described in words for screen readers;
 * the table holds every number the chart shows.
 */
import { segment } from "../api.js";
import { badge, code, credits, h, svg, table, time } from "../dom.js";
import { amountText } from "../units.js";

/** Receipts per page asked for, and pages read at most (the newest are on the last page). */
const pageSize = 100;
const maxPages = 10;
/** Rows of the table: the most recent requests. */
const recentRows = 20;

/**
 * Every receipt of the permit, oldest close first (up to `pageSize * maxPages`).
 * @param {import("../api.js").Api} api
 * @param {string} permitId
 */
export async function fetchReceipts(api, permitId) {
  /** @type {Record<string, any>[]} */
  const all = [];
  let after = "";
  for (let page = 0; page < maxPages; page++) {
    const query = `limit=${pageSize}${after === "" ? "" : `&starting_after=${segment(after)}`}`;
    const answer = await api.get(`/v1/permits/${segment(permitId)}/receipts?${query}`);
    all.push(...answer.data);
    const last = answer.data.at(-1)?.receipt?.message?.requestId;
    if (!answer.has_more || typeof last !== "string") return { receipts: all, complete: true };
    after = last;
  }
  return { receipts: all, complete: false };
}

/**
 * @param {Record<string, any>[]} receipts oldest first
 * @param {boolean} complete whether these are all of the permit's receipts
 * @param {{ decimals?: number, symbol?: string }} [units] the permit's model's credit token's
 */
export function receiptsView(receipts, complete, units = {}) {
  if (receipts.length === 0)
    return h("div", { class: "receipts" }, h("p", { class: "muted" }, "No charged request yet."));
  const recent = receipts.slice(-recentRows).reverse();
  return h(
    "div",
    { class: "receipts" },
    spendChart(receipts, complete, units),
    table(
      `Recent requests of the permit (newest first, ${recent.length} of ${receipts.length}${complete ? "" : "+"})`,
      ["Closed", "Request", "Charge", "Tokens in / out", "Settlement", "Batch", "Transaction"],
      recent.map(({ receipt, settlement }) => {
        const m = receipt.message;
        return [
          time(m.closedAt),
          code(m.requestId),
          credits(m.charge, units),
          `${m.inputTokens} / ${m.outputTokens}`,
          badge(settlement.status),
          code(settlement.batch_id),
          code(settlement.tx_hash),
        ];
      }),
      recent.map(({ receipt, settlement }) => ({
        "data-receipt-request": receipt.message.requestId,
        "data-settlement": settlement.status,
      })),
    ),
  );
}

const width = 600;
const height = 220;
const pad = { left: 16, right: 16, top: 28, bottom: 36 };

/**
 * Cumulative spend over time, one step per charged request; settled requests' marks filled.
 * @param {Record<string, any>[]} receipts oldest first
 * @param {boolean} complete
 * @param {{ decimals?: number, symbol?: string }} units
 */
function spendChart(receipts, complete, units) {
  const times = receipts.map((r) => Number(r.receipt.message.closedAt));
  const charges = receipts.map((r) => BigInt(r.receipt.message.charge));
  const total = charges.reduce((a, b) => a + b, 0n);
  const settled = receipts
    .filter((r) => r.settlement.status === "settled")
    .reduce((a, r) => a + BigInt(r.receipt.message.charge), 0n);
  const t0 = Math.min(...times);
  const t1 = Math.max(...times);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + (t1 === t0 ? plotW / 2 : ((t - t0) / (t1 - t0)) * plotW);
  // Amounts are bigints: scaled in thousandths, a float only for the drawing.
  const y = (amount) =>
    pad.top + plotH - (total === 0n ? 0 : Number((amount * 1000n) / total) / 1000) * plotH;

  const points = [`${x(t0)},${y(0n)}`];
  const marks = [];
  let sum = 0n;
  receipts.forEach((r, i) => {
    points.push(`${x(times[i])},${y(sum)}`);
    sum += charges[i];
    points.push(`${x(times[i])},${y(sum)}`);
    marks.push(
      svg("circle", {
        cx: x(times[i]),
        cy: y(sum),
        r: 4,
        class: r.settlement.status === "settled" ? "mark settled" : "mark open",
      }),
    );
  });

  const captionId = `spend-caption-${Math.random().toString(36).slice(2)}`;
  const date = (t) => new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
  const summary =
    `Spend over time: ${receipts.length}${complete ? "" : "+"} charged request` +
    `${receipts.length === 1 ? "" : "s"} from ${date(t0)} to ${date(t1)} UTC, ` +
    `${amountText(String(total), units)} in all, ${amountText(String(settled), units)} of them settled on chain.`;
  const chart = svg(
    "svg",
    {
      viewBox: `0 0 ${width} ${height}`,
      class: "chart",
      role: "img",
      "aria-labelledby": captionId,
      "data-chart": "spend",
    },
    svg("line", {
      x1: pad.left,
      y1: pad.top + plotH,
      x2: pad.left + plotW,
      y2: pad.top + plotH,
      class: "axis",
    }),
    svg("polyline", { points: points.join(" "), class: "series" }),
    ...marks,
    svg(
      "text",
      { x: pad.left, y: 18, class: "label" },
      `${amountText(String(total), units)} in all`,
    ),
    svg("text", { x: pad.left, y: height - 10, class: "label" }, date(t0)),
    svg("text", { x: width - pad.right, y: height - 10, class: "label end" }, date(t1)),
  );
  return h(
    "figure",
    { class: "chart-figure" },
    chart,
    h("figcaption", { id: captionId, "data-field": "spend-summary" }, summary),
  );
}
