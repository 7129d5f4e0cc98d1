-- Room on each page of the read tables whose rows are updated after their insert, so that
-- the update can stay on the row's page (a HOT update: no new index entries, and the old row
-- version is pruned with the page). Versions change state two or three times (processing,
-- retrieval ready, searchable, enriched), Receipts once (pending to resolved), Records when a
-- Version becomes current. Packed full, every such update moved the row to another page and
-- added an entry to each of the table's indexes. Applies to pages written from now on.
ALTER TABLE versions SET (fillfactor = 70);
ALTER TABLE receipts SET (fillfactor = 80);
ALTER TABLE records SET (fillfactor = 80);
