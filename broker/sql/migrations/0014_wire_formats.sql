-- Wire formats (docs/protocol.md §1.11, §2.4).
--
-- queen_partition_numbers numbers new partitions: queen_partition_id() puts the number inside the
-- partition's UUID (00000000-0000-8000-8nnn-nnnnnnnnnnnn, a version-8 UUID), so the framed pop answer,
-- which carries a partition as a u64, and the acknowledgement that sends that number back as a
-- decimal string name the same partition without a lookup (broker/ids.py). Partitions made before
-- this migration keep their random ids; a pop that claims one of them answers JSON.
CREATE SEQUENCE queen_partition_numbers AS bigint MINVALUE 1 MAXVALUE 4611686018427387903;

-- A consumer group's delivery policy, stored when the group registers (its first pop) and kept from
-- then on: conflation = true delivers only the newest message of a partition and retires the rest.
ALTER TABLE queen_groups ADD COLUMN conflation boolean NOT NULL DEFAULT false;
