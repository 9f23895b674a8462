/**
 * Amounts per UTC day as bars stacked by series (a key's spend by model, an offer's earnings
 * settled or not), drawn as SVG elements: no markup parsed, no inline style (the CSP refuses it;
 * colours are console.css `.series-N`). The drawing is named by its `<title>` and described by
 * its `<desc>` (the total, the busiest day); the caller puts the table of the same numbers beside
 * it. Amounts stay BigInt; a float is used only for a bar's height.
 */
import { h, svg } from "./dom.js";
import { amountText, roughAmountText } from "./units.js";

const daySeconds = 86400;
/** Series colours (console.css `.series-N`), in series order. */
const palette = 6;
const width = 640;
const height = 240;
const pad = { left: 12, right: 12, top: 30, bottom: 34 };

/** A Unix time's UTC day, "2026-11-29". @param {number} seconds */
export function dayText(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 10);
}

/**
 * @param {object} spec
 * @param {{ day: number, series: string, credits: bigint }[]} spec.rows `day`: the day's start
 * @param {string[]} spec.series in stacking (and legend) order
 * @param {number} spec.from the first day's start (Unix seconds)
 * @param {number} spec.days how many days, from `from`
 * @param {{ decimals?: number, symbol?: string }} spec.units
 * @param {string} spec.title
 * @param {string} spec.name the svg's `data-chart`
 */
export function dayChart({ rows, series, from, days, units, title, name }) {
  const perDay = new Map();
  for (const r of rows) perDay.set(r.day, (perDay.get(r.day) ?? 0n) + r.credits);
  const max = [...perDay.values()].reduce((a, b) => (b > a ? b : a), 0n);
  const total = [...perDay.values()].reduce((a, b) => a + b, 0n);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const slot = plotW / days;
  // Scaled in thousandths of the largest day: exact BigInt, then a float for the drawing only.
  const scale = (amount) => (max === 0n ? 0 : Number((amount * 1000n) / max) / 1000) * plotH;

  const bars = [];
  for (let i = 0; i < days; i++) {
    const day = from + i * daySeconds;
    let y = pad.top + plotH;
    series.forEach((s, n) => {
      const cell = rows.find((r) => r.day === day && r.series === s);
      if (cell === undefined || cell.credits === 0n) return;
      const barH = Math.max(1, scale(cell.credits));
      y -= barH;
      bars.push(
        svg("rect", {
          x: pad.left + i * slot + 1,
          y,
          width: Math.max(1, slot - 2),
          height: barH,
          class: `stack series-${n % palette}`,
          "data-day": dayText(day),
          "data-series": s,
        }),
      );
    });
  }
  const id = `chart-${Math.random().toString(36).slice(2)}`;
  const busiest = [...perDay.entries()].find(([, v]) => v === max && v > 0n);
  const described =
    `${amountText(total.toString(), units)} in all over ${days} days (${series.join(", ")})` +
    (busiest === undefined
      ? "."
      : `; the most in one day ${roughAmountText(max, units)}, on ${dayText(busiest[0])}.`);
  return h(
    "figure",
    { class: "chart-figure" },
    svg(
      "svg",
      {
        viewBox: `0 0 ${width} ${height}`,
        class: "chart",
        role: "img",
        "aria-labelledby": `${id}-title ${id}-desc`,
        "data-chart": name,
      },
      svg("title", { id: `${id}-title` }, title),
      svg("desc", { id: `${id}-desc` }, described),
      svg("line", {
        x1: pad.left,
        y1: pad.top + plotH,
        x2: pad.left + plotW,
        y2: pad.top + plotH,
        class: "axis",
      }),
      ...bars,
      svg(
        "text",
        { x: pad.left, y: 18, class: "label" },
        `largest day ${roughAmountText(max, units)}`,
      ),
      svg("text", { x: pad.left, y: height - 10, class: "label" }, dayText(from)),
      svg(
        "text",
        { x: width - pad.right, y: height - 10, class: "label end" },
        dayText(from + (days - 1) * daySeconds),
      ),
    ),
    h("figcaption", { "data-field": "chart-summary" }, described),
    h(
      "ul",
      { class: "legend" },
      ...series.map((s, n) =>
        h("li", {}, h("span", { class: `swatch series-${n % palette}`, "aria-hidden": "true" }), s),
      ),
    ),
  );
}
