// Reference ops are added next to this file; this unit keeps the target non-empty.
