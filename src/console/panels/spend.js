/**
 * The key's spend over time by model (GET /v1/usage by day, the last 30 days): per credit token,
 * a bar chart of each day's credits stacked by model (models priced in different tokens are not
 * added up: each token has its chart), and a table of the same numbers. The chart is drawn as SVG
 * elements (no markup, no inline style: the CSP refuses it), named by its `<title>` and described
 * by its `<desc>`; the table is its text alternative and holds every number it draws.
 */
import { credits, h, table } from "../dom.js";
import { dayChart, dayText } from "../day-chart.js";
import { modelUnits } from "../units.js";

const days = 30;
const daySeconds = 86400;

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
      dayChart({
        rows: rows.map((c) => ({ day: c.day, series: c.model, credits: c.credits })),
        series: models,
        from,
        days,
        units: tokenUnits,
        title: `Spend per day by model, in ${tokenUnits.symbol ?? "base units"}`,
        name: "spend-by-model",
      }),
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
