-- A credit token's decimals and symbol (issue 38, item 3; docs/decisions/catalog-and-indexing.md
-- "Token units"), so that amounts a person reads are written in token units while the API keeps
-- base units and gives these beside them. One row per token, written by the indexer the first
-- time a model names the token (read once per token, from the token's contract) and never
-- updated; a model's view joins it by `models.credit_token`.
--
-- NULL is "unknown": the token did not answer, or answered a value the gateway does not show
-- (decimals above 36; a symbol that is not 1-16 ASCII letters, digits or `$._+-`: a contract can
-- return anything, control characters and markup included). The checks repeat those rules so a
-- row that breaks them cannot exist whoever writes it.
CREATE TABLE credit_tokens (
  token text PRIMARY KEY,
  decimals smallint CHECK (decimals BETWEEN 0 AND 36),
  symbol text CHECK (symbol ~ '^[A-Za-z0-9$._+-]{1,16}$'),
  read_block bigint NOT NULL,
  read_at timestamptz NOT NULL DEFAULT now()
);
