-- The frozen arguments as people may see them (secrets masked), beside the exact ones that run.
ALTER TABLE proposals ADD COLUMN arguments_shown TEXT;
