"""The step loop, its optimizer boundary, schedule, and run outputs."""
