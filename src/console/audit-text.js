/**
 * What an offer's audits say, as a person reads it (issue 39, item 6): the `audit` member of the
 * catalog's offers (state, e-value and the thresholds as decimal strings, reference kind).
 */

/**
 * @param {{ state?: string, e_value?: string, flag_at?: string | null, exclude_at?: string | null, reference_kind?: string | null } | null | undefined} audit
 * @returns {string}
 */
export function auditText(audit) {
  if (audit === null || audit === undefined) return "unknown";
  const against = audit.reference_kind ? ` against the ${audit.reference_kind}` : "";
  switch (audit.state) {
    case "unaudited":
      return "not audited yet";
    case "passing":
      return `passing${against} (e-value ${audit.e_value}, flags at ${audit.flag_at})`;
    case "flagged":
      return `model mismatch: flagged${against} (e-value ${audit.e_value} ≥ ${audit.flag_at})`;
    case "excluded":
      return `model mismatch: out of routing until verified again (e-value ${audit.e_value} ≥ ${audit.exclude_at})`;
    default:
      return "unknown";
  }
}
