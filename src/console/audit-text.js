/**
 * What an offer's audits say, as a person reads it (issue 39, item 6): the `audit` member of the
 * catalog's offers (state, e-value and the thresholds as decimal strings, reference kind).
 */

/**
 * A pass from audits that ask the shipped corpus (`GET /v1/gateway`'s `audit_corpus`) says so: a
 * provider can read those prompts and answer them honestly, and only them.
 * @param {{ state?: string, e_value?: string, flag_at?: string | null, exclude_at?: string | null, reference_kind?: string | null } | null | undefined} audit
 * @param {string | null | undefined} [corpus] `GET /v1/gateway`'s `audit_corpus`
 * @returns {string}
 */
export function auditText(audit, corpus) {
  if (audit === null || audit === undefined) return "unknown";
  const against = audit.reference_kind ? ` against the ${audit.reference_kind}` : "";
  switch (audit.state) {
    case "unaudited":
      return "not audited yet";
    case "passing":
      return (
        `passing${against} (e-value ${audit.e_value}, flags at ${audit.flag_at})` +
        (corpus === "shipped"
          ? "; the audits ask public prompts, which a provider can tell from clients'"
          : "")
      );
    case "flagged":
      return `model mismatch: flagged${against} (e-value ${audit.e_value} ≥ ${audit.flag_at})`;
    case "excluded":
      return `model mismatch: out of routing until verified again (e-value ${audit.e_value} ≥ ${audit.exclude_at})`;
    default:
      return "unknown";
  }
}
