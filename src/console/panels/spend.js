/**
 * The key's spend over time by model (GET /v1/usage by day, the last 30 days): per credit token,
 * a bar chart of each day's credits stacked by model (models priced in different tokens are not
 * added up: each token has its chart), and a table of the same numbers. The chart is drawn as SVG
 * elements (no markup, no inline style: the CSP refuses it), named by its `<title>` and described
 * by its `<desc>`; the table is its text alternative and holds every number it draws.
 */
import { h, svg, table, credits } from "../dom.js";
import { amountText, modelUnits, roughAmountText } from "../units.js";

const days = 30;
const daySeconds = 86400;
/** Series colours (console.css `.series-N`), in model order. */
const palette = 6;

/** @type {import("../app.js").Panel} */
export const spendPanel = {
  id: "spend",
  title: "Spend over time",
  mount(section, { api, events }) {
    const reload = h("button", { type: "button" }, "Refresh spend");
    const status = h("p", { class: "status", role: "status" });
    const view = h("div", { class: "spend" });
    section.append(
      h(
        "p",
        { class: "hint" },
        `Credits this key's requests were charged, by UTC day and model, over the last ${days} days.`,
      ),
      h("div", { class: "buttons" }, reload),
      status,
      view,
    );
    let generation = 0;

    async function load() {
      const mine = ++generation;
      view.replaceChildren();
      if (!api.hasKey()) {
        status.textContent = "Enter an API key to see its spend.";
        return;
      }
      status.textContent = "Loading spend…";
      try {
        const to = Math.floor(Date.now() / 1000 / daySeconds + 1) * daySeconds;
        const from = to - days * daySeconds;
        const usage = await api.get(`/v1/usage?bucket=day&from=${from}&to=${to}`);
        const models = [...new Set(usage.groups.map((g) => String(g.model)))].sort();
        const units = new Map(
          await Promise.all(models.map(async (m) => [m, await modelUnits(api, m)])),
        );
        if (mine !== generation) return;
        status.textContent =
          usage.groups.length === 0 ? `No request in the last ${days} days.` : "";
        if (usage.groups.length > 0) view.replaceChildren(...spendViews(usage, from, units));
      } catch (error) {
        if (mine !== generation) return;
        const e = /** @type {{ code?: string, message?: string }} */ (error);
        status.textContent = `${e.code ?? "error"}: ${e.message ?? String(error)}`;
      }
    }

    reload.addEventListener("click", load);
    events.addEventListener("key", load);
    events.addEventListener("ledger", load);
    status.textContent = "Enter an API key to see its spend.";
  },
};

/** @typedef {{ decimals?: number, symbol?: string }} Units */

/**
 * One chart and table per credit token.
 * @param {Record<string, any>} usage
 * @param {number} from Unix seconds, the first day's start
 * @param {Map<string, Units>} units by model
 */
function spendViews(usage, from, units) {
  /** By day start, then model: [credits, requests, input, output]. */
  const cells = new Map();
  for (const g of usage.groups) {
    const key = `${g.starts_at} ${g.model}`;
    const c = cells.get(key) ?? {
      day: Number(g.starts_at),
      model: String(g.model),
      credits: 0n,
      requests: 0,
      input: 0n,
      output: 0n,
    };
    c.credits += BigInt(g.credits);
    c.requests += Number(g.requests);
    c.input += BigInt(g.input_tokens);
    c.output += BigInt(g.output_tokens);
    cells.set(key, c);
  }
  /** Models by token (its symbol and decimals, or "unknown units"). */
  const tokens = new Map();
  for (const [model, u] of units) {
    const token = u.decimals === undefined ? "base units" : `${u.symbol ?? "units"}/${u.decimals}`;
    tokens.set(token, [...(tokens.get(token) ?? []), model]);
  }
  return [...tokens.values()].map((models) => {
    const tokenUnits = /** @type {Units} */ (units.get(models[0]));
    const rows = [...cells.values()]
      .filter((c) => models.includes(c.model))
      .sort((a, b) => b.day - a.day || a.model.localeCompare(b.model));
    return h(
      "div",
      { class: "spend-token", "data-spend-token": tokenUnits.symbol ?? "base units" },
      chart(rows, models, from, tokenUnits),
      table(
        `Spend by day and model, in ${tokenUnits.symbol ?? "base units"} (newest first)`,
        ["Day (UTC)", "Model", "Requests", "Tokens in / out", "Spend"],
        rows.map((c) => [
          dayText(c.day),
          c.model,
          String(c.requests),
          `${c.input} / ${c.output}`,
          credits(c.credits.toString(), tokenUnits),
        ]),
        rows.map((c) => ({ "data-spend-day": dayText(c.day), "data-spend-model": c.model })),
      ),
    );
  });
}

/** @param {number} seconds */
function dayText(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 10);
}

const width = 640;
const height = 240;
const pad = { left: 12, right: 12, top: 30, bottom: 34 };

/**
 * Bars per day stacked by model, with a legend.
 * @param {{ day: number, model: string, credits: bigint }[]} rows
 * @param {string[]} models
 * @param {number} from
 * @param {Units} units
 */
function chart(rows, models, from, units) {
  const perDay = new Map();
  for (const r of rows) perDay.set(r.day, (perDay.get(r.day) ?? 0n) + r.credits);
  const max = [...perDay.values()].reduce((a, b) => (b > a ? b : a), 0n);
  const total = [...perDay.values()].reduce((a, b) => a + b, 0n);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const slot = plotW / days;
  // Amounts are bigints: scaled in thousandths of the largest day, a float only for the drawing.
  const scale = (amount) => (max === 0n ? 0 : Number((amount * 1000n) / max) / 1000) * plotH;

  const bars = [];
  for (let i = 0; i < days; i++) {
    const day = from + i * daySeconds;
    let y = pad.top + plotH;
    models.forEach((model, m) => {
      const cell = rows.find((r) => r.day === day && r.model === model);
      if (cell === undefined || cell.credits === 0n) return;
      const barH = Math.max(1, scale(cell.credits));
      y -= barH;
      bars.push(
        svg("rect", {
          x: pad.left + i * slot + 1,
          y,
          width: Math.max(1, slot - 2),
          height: barH,
          class: `stack series-${m % palette}`,
          "data-day": dayText(day),
          "data-series": model,
        }),
      );
    });
  }
  const id = `spend-${Math.random().toString(36).slice(2)}`;
  const busiest = [...perDay.entries()].find(([, v]) => v === max);
  const described =
    `${amountText(total.toString(), units)} in all over ${days} days for ${models.join(", ")}; ` +
    `the most in one day ${roughAmountText(max, units)}` +
    (busiest === undefined ? "." : ` on ${dayText(busiest[0])}.`);
  const legend = models.map((model, m) =>
    h("li", {}, h("span", { class: `swatch series-${m % palette}`, "aria-hidden": "true" }), model),
  );
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
        "data-chart": "spend-by-model",
      },
      svg(
        "title",
        { id: `${id}-title` },
        `Spend per day by model, in ${units.symbol ?? "base units"}`,
      ),
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
    h("figcaption", { "data-field": "spend-total" }, described),
    h("ul", { class: "legend" }, ...legend),
  );
}
