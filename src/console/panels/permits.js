/**
 * The permits the key may spend (GET /v1/permits), each with its balance and burn rate: the
 * credits its requests were charged over the last 7 days (GET /v1/usage?permit=), per day, and
 * the days its available balance lasts at that rate. Amounts in the permit's model's token units.
 *
 * An authorization may name no permit (every permit of its payer): the gateway lists each permit
 * that payer opened (the newest 100, indexed from the chain's PermitOpened events).
 */
import { segment } from "../api.js";
import { badge, code, credits, h, messageLine, table } from "../dom.js";
import { modelOf, roughAmountText, tokenUnits } from "../units.js";

/** The burn rate's window: GET /v1/usage's default range. */
const burnDays = 7n;
/** Beyond this, "days left" says "more than 100 years". */
const maxDaysLeft = 36500n;

/** @type {import("../app.js").Panel} */
export const permitsPanel = {
  id: "permits",
  title: "Your permits",
  mount(section, { api, events }) {
    const message = messageLine();
    const reload = h("button", { type: "button" }, "Refresh permits");
    const view = h("div", { class: "permits" });
    section.append(
      h(
        "p",
        { class: "hint" },
        "What this key may spend, and how fast it is spending it: the burn rate is the credits charged over the last 7 days, per day.",
      ),
      h("div", { class: "buttons" }, reload),
      message.element,
      view,
    );
    let generation = 0;

    async function load() {
      const mine = ++generation;
      view.replaceChildren();
      if (!api.hasKey()) {
        message.info("Enter an API key to see the permits it may spend.");
        return;
      }
      message.info("Loading permits…");
      try {
        const rows = await readPermits(api);
        if (mine !== generation) return;
        message.info(
          rows.length === 0
            ? "No permit yet: this key is authorized for none, and has paid for no request."
            : `${rows.length} permit${rows.length === 1 ? "" : "s"}.`,
        );
        if (rows.length > 0) view.replaceChildren(permitsTable(rows, events));
      } catch (error) {
        if (mine === generation) message.error(error);
      }
    }

    reload.addEventListener("click", load);
    events.addEventListener("key", load);
    events.addEventListener("ledger", load);
    message.info("Enter an API key to see the permits it may spend.");
  },
};

/**
 * The permits, with their model's units and last 7 days' credits.
 * @param {import("../api.js").Api} api
 */
async function readPermits(api) {
  const listed = await api.get("/v1/permits");
  /** @type {Record<string, any>[]} */
  const permits = listed.data;
  return Promise.all(
    permits.map(async (permit) => {
      const [model, usage] = await Promise.all([
        modelOf(api, permit.model_id),
        // A permit whose usage cannot be read still shows its balance (its rate as unknown).
        api.get(`/v1/usage?permit=${segment(permit.permit_id)}`).catch(() => undefined),
      ]);
      const spent =
        usage === undefined
          ? undefined
          : usage.groups.reduce((sum, g) => sum + BigInt(g.credits), 0n);
      return {
        permit,
        units: model === undefined ? {} : tokenUnits(model),
        spent,
        model: model?.id,
      };
    }),
  );
}

/**
 * @param {{ permit: Record<string, any>, units: { decimals?: number, symbol?: string }, spent?: bigint, model?: string }[]} rows
 * @param {EventTarget} events
 */
function permitsTable(rows, events) {
  return table(
    "Permits this key may spend",
    [
      "Permit",
      "State",
      "Available",
      "Deposit",
      "Spent, last 7 days",
      "Burn rate per day",
      "Days left at this rate",
    ],
    rows.map(({ permit, units, spent, model }) => {
      const unknown = h("span", { class: "muted" }, "unknown");
      const show = h(
        "button",
        { type: "button", class: "link" },
        code(short(permit.permit_id)),
        h(
          "span",
          { class: "visually-hidden" },
          ": permit ",
          h("code", {}, permit.permit_id),
          ", show its balance and receipts",
        ),
      );
      show.addEventListener("click", () =>
        events.dispatchEvent(new CustomEvent("show-permit", { detail: permit.permit_id })),
      );
      return [
        h(
          "span",
          {},
          show,
          model === undefined ? null : h("span", { class: "muted" }, ` ${model}`),
        ),
        badge(permit.state),
        credits(permit.available, units),
        credits(permit.deposit, units),
        spent === undefined ? unknown : credits(spent.toString(), units),
        spent === undefined
          ? unknown
          : spent === 0n
            ? h("span", { class: "muted" }, "no spend")
            : h(
                "span",
                { class: "amount", "data-field": "burn" },
                roughAmountText(spent / burnDays, units),
              ),
        spent === undefined ? unknown : daysLeft(BigInt(permit.available), spent),
      ];
    }),
    rows.map(({ permit }) => ({ "data-permit-row": permit.permit_id })),
  );
}

/**
 * The days `available` lasts when `spent` went in 7 days, to a tenth of a day (exact BigInt).
 * @param {bigint} available
 * @param {bigint} spent over {@link burnDays}
 */
export function daysLeft(available, spent) {
  if (spent === 0n) return h("span", { class: "muted" }, "no spend to project");
  const tenths = (available * burnDays * 10n) / spent;
  if (tenths >= maxDaysLeft * 10n)
    return h("span", { "data-field": "days-left" }, "over 100 years");
  return h(
    "span",
    { "data-field": "days-left" },
    `${tenths / 10n}.${tenths % 10n} day${tenths === 10n ? "" : "s"}`,
  );
}

/** An id as its first and last hex digits (the full id is the button's accessible name). @param {string} id */
export function short(id) {
  return `${id.slice(0, 6)}…${id.slice(-4)}`;
}
