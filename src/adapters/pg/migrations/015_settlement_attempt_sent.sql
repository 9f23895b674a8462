-- Issue 19: the chain head when the node first took an attempt (its broadcast answered sent or
-- already known). Only an attempt the node holds can be replaced with higher fees, and the
-- replacement rule counts its blocks from here; an attempt never taken (a broadcast that failed,
-- was refused, or never ran) is re-sent as it is. NULL for attempts made before this column:
-- their next re-send records it.
ALTER TABLE settlement_attempts ADD COLUMN sent_block bigint;
